"""The house rules of the package, read from its source with `ast`: no import circle (module-level or inside
functions), no library module importing the command line, a command line that parses without the library, no import
hook, no function over 80 lines, no host comparing a mechanism
name, no `layout` parameter in a mechanism, one mechanism keyword across the backbone families, and every float64
reference in `attention/functional/`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "subquad"
CLI_ROOT = ROOT.parent / "subquad_cli"
#: subquad_cli's torch-free modules that the library shares (the rest of subquad_cli is the command line).
CLI_FOUNDATION = ("errors", "version", "recipes", "runconfig", "denseconfig")


def _modules() -> dict[str, Path]:
    mods = {}
    for p in [*ROOT.rglob("*.py"), *CLI_ROOT.rglob("*.py")]:
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    return mods


MODULES = _modules()


def _imports(name: str, path: Path, everywhere: bool) -> set[str]:
    """The package modules that `name` imports (at module level, or anywhere when `everywhere`), TYPE_CHECKING
    blocks excluded."""
    tree = ast.parse(path.read_text())
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    nodes = list(ast.walk(tree)) if everywhere else tree.body
    skip = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If) and "TYPE_CHECKING" in ast.unparse(b.test)
            for n in ast.walk(b)}
    out = set()
    for n in nodes:
        if id(n) in skip:
            continue
        if isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            for a in n.names:
                full = f"{mod}.{a.name}"
                out.add(full if full in MODULES else mod)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return {m for m in out if m in MODULES and m != name}


def _cycles(everywhere: bool) -> list[list[str]]:
    graph = {m: _imports(m, p, everywhere) for m, p in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("everywhere", [False, True], ids=["module-level", "with-function-imports"])
def test_no_import_circle(everywhere):
    assert _cycles(everywhere) == []


def test_the_cycle_finder_finds_a_circle(monkeypatch):
    # the check can fail: a package whose __init__ imports a module that imports the package back
    fake = {"p": "from . import a\n", "p.a": "from . import thing\n"}
    monkeypatch.setattr(Path, "read_text", lambda self: fake[self.name])
    monkeypatch.setitem(globals(), "MODULES", {"p": Path("p"), "p.a": Path("p.a")})
    assert _imports("p.a", Path("p.a"), False) == {"p"}


def _cli_imports_of_the_library(modules: dict[str, Path]) -> list[str]:
    """Library modules importing the command line (subquad_cli beyond its foundation); subquad/__main__.py is
    `python -m subquad`, the command's own entry point."""
    shared = {f"subquad_cli.{m}" for m in CLI_FOUNDATION}
    return [f"{m} imports {i}" for m, p in modules.items() if m.split(".")[0] == "subquad" and m != "subquad.__main__"
            for i in sorted(_imports(m, p, True)) if i.split(".")[0] == "subquad_cli" and i not in shared]


def test_only_the_command_imports_the_command(monkeypatch):
    assert _cli_imports_of_the_library(MODULES) == []
    # the check sees a library module reaching for a subcommand
    probe = {"subquad.arena.probe": "def f():\n    from subquad_cli.train import add_parser\n"}
    monkeypatch.setattr(Path, "read_text", lambda self: probe[self.name])
    assert _cli_imports_of_the_library({"subquad.arena.probe": Path("subquad.arena.probe")}) == [
        "subquad.arena.probe imports subquad_cli.train"]


def _library_imports_of_the_parsers(modules: dict[str, Path], roots: list[str]) -> list[str]:
    """What would make `subquad --help` import torch: a module that building the parsers imports (`roots` and what
    they import at module level) importing the library (`subquad`, whose import registers every model), or a
    foundation module importing it anywhere."""
    seen, todo, bad = set(), list(roots), []
    while todo:
        m = todo.pop()
        if m in seen or m not in modules:
            continue
        seen.add(m)
        todo += [i for i in _imports(m, modules[m], False) if i.split(".")[0] == "subquad_cli"]
    for m in sorted(seen | {m for m in modules if m.split(".")[0] == "subquad_cli" and m.split(".")[-1] in
                            CLI_FOUNDATION}):
        tree = ast.parse(modules[m].read_text())
        for n in list(ast.walk(tree)) if m.split(".")[-1] in CLI_FOUNDATION else tree.body:
            names = ([n.module or ""] if isinstance(n, ast.ImportFrom) and not n.level
                     else [a.name for a in n.names] if isinstance(n, ast.Import) else [])
            bad += [f"{m}:{n.lineno} imports {x}" for x in names if x.split(".")[0] == "subquad"]
    return bad


def test_the_command_line_parses_without_the_library(monkeypatch):
    from subquad_cli.__main__ import COMMANDS

    roots = ["subquad_cli.__main__"] + [f"subquad_cli.{m}" for m in COMMANDS.values()]
    assert all(r in MODULES for r in roots)
    assert _library_imports_of_the_parsers(MODULES, roots) == []
    # the check sees a parser module importing the library at module level (also through a module it imports),
    # and a foundation module importing it anywhere; a module no parser imports may import the library
    probe = {"subquad_cli.probe": "import argparse\nfrom .helper import x\n",
             "subquad_cli.helper": "from subquad.models import create_model\n",
             "subquad_cli.runconfig": "def f():\n    import subquad\n",
             "subquad_cli.run_only": "import subquad\n"}
    monkeypatch.setattr(Path, "read_text", lambda self: probe[self.name])
    monkeypatch.setitem(globals(), "MODULES", {m: Path(m) for m in probe})
    assert _library_imports_of_the_parsers(MODULES, ["subquad_cli.probe"]) == [
        "subquad_cli.helper:1 imports subquad.models", "subquad_cli.runconfig:2 imports subquad"]


def _import_hooks(modules: dict[str, Path]) -> list[str]:
    """Code that changes how Python imports (`sys.meta_path`, `sys.path_hooks`): `import subquad` is plain."""
    return [f"{m}:{n.lineno} {n.attr}" for m, p in modules.items() for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.Attribute) and n.attr in ("meta_path", "path_hooks")]


def test_no_import_hook(monkeypatch):
    assert _import_hooks(MODULES) == []
    probe = {"subquad.probe": "import sys\nsys.meta_path.insert(0, object())\n"}
    monkeypatch.setattr(Path, "read_text", lambda self: probe[self.name])
    assert _import_hooks({"subquad.probe": Path("subquad.probe")}) == ["subquad.probe:2 meta_path"]


def test_no_function_over_80_lines():
    long = [f"{p.relative_to(ROOT.parent)}:{n.name} ({n.end_lineno - n.lineno + 1})" for p in MODULES.values()
            for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > 80]
    assert long == []


def _compared_names(path: Path, names: set[str]) -> list[str]:
    hits = []
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Compare):
            for c in ast.walk(n):
                if isinstance(c, ast.Constant) and c.value in names:
                    hits.append(f"{path.name}:{n.lineno} {c.value!r}")
    return hits


def test_hosts_never_compare_a_mechanism_name():
    import subquad

    names = set(subquad.list_attention())
    files = sorted((ROOT / "models").glob("*.py")) + sorted((ROOT / "sequence").glob("*.py"))
    assert [h for p in files for h in _compared_names(p, names)] == []
    # and the check sees a comparison when there is one
    probe = ROOT.parent / "tests" / "_fixtures" / "host_name_test_probe.txt"
    assert probe.is_file()
    assert _compared_names(probe, names) != []


def test_no_mechanism_takes_a_layout():
    import inspect

    import subquad
    from subquad.attention import get_attention_cls

    with_layout = [n for n in subquad.list_attention()
                   if {"layout", "qkv_layout"} & set(inspect.signature(get_attention_cls(n).__init__).parameters)]
    assert with_layout == []


def _prints(path: Path) -> list[str]:
    return [f"{path.name}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("print", "breakpoint")]


def test_library_code_never_prints():
    # the command prints; the library logs or returns (subquad/__main__.py only hands over to the command)
    lib = [p for m, p in MODULES.items() if not m.startswith("subquad_cli")]
    assert [h for p in lib for h in _prints(p)] == []
    assert _prints(CLI_ROOT / "dense_run.py")  # the check sees a print where there is one


def test_one_mechanism_keyword_across_families():
    """Every registered backbone host takes its mechanism as `attn=` and its options as `attn_kwargs=`; no other
    parameter names a mechanism except the deprecated spellings a host declares (`deprecated_attn`)."""
    import inspect

    import subquad
    from subquad.models._builder import HOSTS

    assert set(HOSTS) == set(subquad.list_models())
    params = {c: set(inspect.signature(c).parameters) for c in set(HOSTS.values())}
    assert [c.__name__ for c, p in params.items() if not {"attn", "attn_kwargs"} <= p] == []
    others = [f"{c.__name__}({n}=)" for c, p in params.items() for n in sorted(p)
              if n.endswith(("_attn", "_attention")) and n not in c.deprecated_attn]
    assert others == []


def _refs_outside_functional(modules: dict[str, Path]) -> list[str]:
    """Module-level functions named `*_ref` (float64 references) outside `subquad/attention/functional/`."""
    return [f"{m}:{n.name}" for m, p in modules.items() if not m.startswith("subquad.attention.functional")
            for n in ast.parse(p.read_text()).body if isinstance(n, ast.FunctionDef) and n.name.endswith("_ref")]


def test_every_reference_lives_in_functional(tmp_path):
    """The one home of a mechanism's float64 reference (and of the fast path it checks): the mechanism's file in
    `subquad/attention/functional/`; a mechanism module holds the module (parameters, projections) only."""
    assert _refs_outside_functional(MODULES) == []
    # and the check sees a reference elsewhere
    probe = tmp_path / "probe.py"
    probe.write_text("def probe(x):\n    return x\n\n\ndef probe_ref(x):\n    return x\n")
    assert _refs_outside_functional({"subquad.attention.probe": probe}) == ["subquad.attention.probe:probe_ref"]
    assert _refs_outside_functional({"subquad.attention.functional.probe": probe}) == []


def _dict_updates(path: Path) -> list[str]:
    """`<anything>.__dict__.update(...)` calls: an object filled from a dict instead of named fields."""
    return [f"{path.name}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "update"
            and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "__dict__"]


def test_engine_objects_have_named_fields(tmp_path):
    """The engine's and the dense engine's tasks take named fields (no `self.__dict__.update(run)`), and the shared
    loop takes keyword arguments only."""
    import inspect

    from subquad.engine.loop import Loop

    files = sorted((ROOT / "engine").glob("*.py")) + sorted((ROOT / "dense").glob("*.py"))
    assert [h for p in files for h in _dict_updates(p)] == []
    probe = tmp_path / "probe.py"
    probe.write_text("class T:\n    def __init__(self, run):\n        self.__dict__.update(run)\n")
    assert _dict_updates(probe) == ["probe.py:3"]  # the check sees one where there is one
    params = list(inspect.signature(Loop.__init__).parameters.values())[1:]
    assert [p.name for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY] == []


def _set_before_super(path: Path) -> list[str]:
    """`self.<attr> = ...` in an `__init__` before its `super().__init__(...)` call: state a subclass hands to its
    base class's constructor behind its back (pass it as an argument instead)."""
    hits = []
    classes = [c for c in ast.walk(ast.parse(path.read_text())) if isinstance(c, ast.ClassDef)]
    for cls in classes:
        for f in [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]:
            calls = [i for i, st in enumerate(f.body) if "super().__init__(" in ast.unparse(st)]
            for st in f.body[:calls[0]] if calls else []:
                hits += [f"{path.name}:{n.lineno} {cls.name}.{t.attr}" for n in ast.walk(st)
                         if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                         for tgt in (n.targets if isinstance(n, ast.Assign) else [n.target]) for t in ast.walk(tgt)
                         if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"]
    return hits


def test_no_constructor_sets_state_before_its_base_constructor(tmp_path):
    """A base class never reads attributes that a subclass set before calling it (the focused-linear and long-short
    modules pass their projection settings to the base constructor as arguments)."""
    assert [h for p in MODULES.values() for h in _set_before_super(p)] == []
    probe = tmp_path / "probe.py"
    probe.write_text("class A(B):\n    def __init__(self, x):\n        self.x = x\n        super().__init__()\n")
    assert _set_before_super(probe) == ["probe.py:3 A.x"]


# The layers of the package, lowest first: a unit (a top-level module or subpackage of subquad; the functional core
# counts as its own unit) imports only units of lower layers, at module level or inside a function. Written down
# from the tree as it is (attention never imports models; only the command imports the command). subquad_cli is the
# command line ("cli") above the library, and its foundation below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli.foundation",),  # subquad_cli's torch-free modules (errors, version, recipes, config dataclasses)
    ("errors", "version", "files"),
    ("_shapes", "backend", "registry", "config"),
    ("layers", "data", "export"),
    ("attention.functional",),
    ("attention",),
    ("models", "sequence", "analysis"),
    ("bench",),
    ("subquad", "engine"),  # `subquad` is the package's __init__ (the public API)
    ("dense",),
    ("arena",),
    ("cli",),
    ("__main__",),
)


def _unit(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "subquad_cli":
        return "cli.foundation" if parts[-1] in CLI_FOUNDATION else "cli"
    if parts[1:3] == ["attention", "functional"]:
        return "attention.functional"
    return parts[1] if len(parts) > 1 else "subquad"


def _layer_violations(modules: dict[str, Path]) -> list[str]:
    layer = {u: i for i, units in enumerate(LAYERS) for u in units}
    bad = [f"{m}: {_unit(m)} is in no layer of LAYERS" for m in modules if _unit(m) not in layer]
    for m, p in modules.items():
        for i in sorted(_imports(m, p, True)):
            a, b = _unit(m), _unit(i)
            if a != b and a in layer and layer.get(b, len(LAYERS)) >= layer[a]:
                bad.append(f"{m} imports {i} ({a} must not import {b})")
    return bad


def test_imports_go_down_the_layers(monkeypatch):
    assert _layer_violations(MODULES) == []
    # and the check sees an upward import where there is one (attention importing a model)
    probe = {"subquad.attention.probe": "def f():\n    from ..models.cvt_ls import CvTLS\n"}
    monkeypatch.setattr(Path, "read_text", lambda self: probe[self.name])
    assert _layer_violations({"subquad.attention.probe": Path("subquad.attention.probe")}) == [
        "subquad.attention.probe imports subquad.models.cvt_ls (attention must not import models)"]


def _head_split_permutes(path: Path) -> list[str]:
    """`.permute(2, 0, 3, 1, 4)`: the q/k/v head split, whose one home is `_shapes.split_packed_heads`."""
    return [f"{path.name}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "permute"
            and [getattr(a, "value", None) for a in n.args] == [2, 0, 3, 1, 4]]


def test_the_head_split_lives_in_shapes(tmp_path):
    assert [h for m, p in MODULES.items() if m != "subquad._shapes" for h in _head_split_permutes(p)] == []
    assert _head_split_permutes(ROOT / "_shapes.py")  # the check sees the one it allows
    probe = tmp_path / "probe.py"
    probe.write_text("def f(x):\n    return x.reshape(1, 2, 3, 4, 5).permute(2, 0, 3, 1, 4)\n")
    assert _head_split_permutes(probe) == ["probe.py:2"]
