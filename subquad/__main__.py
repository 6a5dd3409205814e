import sys

from subquad.cli.__main__ import main

sys.exit(main())
