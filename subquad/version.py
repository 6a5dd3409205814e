"""The package version, defined in `subquad_cli.version` (`subquad --version` answers without importing torch)."""

from subquad_cli.version import __version__

__all__ = ["__version__"]
