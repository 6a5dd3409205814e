"""The `subquad` command line, and the torch-free pieces it shares with the library.

`subquad --help`, every subcommand's `--help` and an argument error answer without importing torch, so everything
that building the parsers needs lives here, outside the `subquad` package (whose `import` registers every model and
so loads torch and timm):
- `errors` (`UserError` and its helpers) and `version`, re-exported by `subquad.errors` and `subquad.version`;
- `recipes` (finding and reading recipe YAML and a run's args.yaml);
- `runconfig` and `denseconfig`: the config dataclasses of the training commands, the one source of their flags,
  recipe keys and `--resume` rule;
- `config`: the flags built from those dataclasses;
- one module per subcommand (`__main__.COMMANDS`), whose `add_parser` builds its parser and whose command function
  imports the library when it runs.

The first group never imports `subquad`; the subcommands import it only inside the functions that run a command
(`tests/test_package_structure.py` holds both).
"""
