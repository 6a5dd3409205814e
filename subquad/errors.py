"""User-facing errors: `UserError` and its helpers, defined in `subquad_cli.errors` (the command line raises and
catches the same class before it imports the library) and re-exported here for the library and its users."""

from subquad_cli.errors import UserError, closest, unknown_name, unsafe_pickle

__all__ = ["UserError", "closest", "unknown_name", "unsafe_pickle"]
