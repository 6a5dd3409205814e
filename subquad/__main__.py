import sys

from subquad_cli.__main__ import main

sys.exit(main())
