"""The official model code (L2ViT, FLatten-Transformer, Transformer-LS, PolaFormer), loaded by file path for parity
checks.

Test and benchmark support (parity tests, `benchmarks/official.py`); not part of the package. It imports no
official code at import time: every function takes the root of the official checkouts (the folder holding `L2ViT/`,
`FLatten-Transformer/`, `transformer-ls/` and `PolaFormer/`; tests and benchmarks read it from
`SUBQUAD_OFFICIAL_ROOT`). The files are never installed.

While an official file executes: timm's `register_model` is a no-op (their names, e.g. `flatten_pvt_tiny`, are also
ours); when einops is not installed a stand-in is put in `sys.modules` (the FLatten files import `rearrange` but call
it only on paths we do not run; CSwin's stem uses `Rearrange('b c h w -> b (h w) c')`, the one pattern the stand-in
implements); stdout and warnings (construction prints, timm's deprecated-import warnings) are silenced. Official
constructors print too: build through `build_official`, or wrap calls in `quiet()`.

`build_official(root, name)` builds the official counterpart of our registered model `name` exactly as the official
configs do (FLatten `cfgs/*.yaml` with `config.py` defaults, L2ViT's variant functions, the Transformer-LS launch
scripts' MsViT arch strings); `OFFICIAL_NAMES` lists the names it knows.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from torch import nn

from subquad.errors import UserError

__all__ = ["OFFICIAL_NAMES", "official_file", "load_module", "load_l2vit", "load_flatten", "load_pola", "load_msvit",
           "load_agent", "build_official", "official_files", "quiet"]

ROOT_HINT = ("SUBQUAD_OFFICIAL_ROOT must name the folder holding L2ViT/, FLatten-Transformer/, transformer-ls/, "
             "PolaFormer/ and Agent-Attention/")

_L2VIT = "L2ViT/classification/models/l2vit.py"
_FLATTEN = "FLatten-Transformer/models/{}.py"
_MSVIT = ("imagenet/models/layers/full_attention.py", "imagenet/models/layers/transformer_ls.py",
          "imagenet/models/msvit.py")

# Official variant per registered name. FLatten: cfgs/*.yaml (LA focusing factor 3, kernel 5 and PVT la_sr_ratios
# 1111 are config.py defaults, CSwin la_split_size 56-28-14-7 at 224); Transformer-LS: launch/eval/*.sh arch strings.
_L2VIT_FNS = {"l2vit_tiny": "L2ViT_Tiny", "l2vit_small": "L2ViT_Small", "l2vit_base": "L2ViT_Base",
              "l2vit_base_384": "L2ViT_Base_384"}
_SWIN = {"flatten_swin_tiny": (96, (2, 2, 6, 2), (3, 6, 12, 24), 224),
         "flatten_swin_small": (96, (2, 2, 18, 2), (3, 6, 12, 24), 224),
         "flatten_swin_base": (128, (2, 2, 18, 2), (4, 8, 16, 32), 224),
         "flatten_swin_base_384": (128, (2, 2, 18, 2), (4, 8, 16, 32), 384)}
_CSWIN_FNS = {"flatten_cswin_tiny": ("FLatten_CSWin_64_24181_tiny_224", 224),
              "flatten_cswin_small": ("FLatten_CSWin_64_24322_small_224", 224),
              "flatten_cswin_base": ("FLatten_CSWin_96_36292_base_224", 224),
              "flatten_cswin_base_384": ("FLatten_CSWin_96_36292_base_384", 384)}
_PVT = [f"flatten_pvt_{n}" for n in ("tiny", "small", "medium", "large")]
_PVT_V2 = [f"flatten_pvt_v2_b{b}" for b in range(6)]
# PolaFormer (ZacharyMeng/PolaFormer): cfgs/pola_swin_*.yaml (window 56, 'LLSS') and cfgs/pola_pvt_*.yaml ('LLLL');
# alpha 4, kernel 5 and PVT la_sr_ratios 1111 are config.py defaults.
_POLA = "PolaFormer/models/{}.py"
_POLA_SWIN = {"pola_swin_tiny": (96, (2, 2, 6, 2), (3, 6, 12, 24)),
              "pola_swin_small": (96, (2, 2, 18, 2), (3, 6, 12, 24)),
              "pola_swin_base": (128, (2, 2, 18, 2), (4, 8, 16, 32))}
_POLA_PVT = ["pola_pvt_tiny", "pola_pvt_small"]


def _vil_arch(blocks: tuple[int, int], w: int) -> str:
    stages = [f"l1,h3,d96,n1,s1,g1,p4,f{w},a0,r8", f"l2,h3,d192,n{blocks[0]},s1,g1,p2,f{w},a0,r8",
              f"l3,h6,d384,n{blocks[1]},s0,g1,p2,f{w},a0,r8", f"l4,h12,d768,n1,s0,g0,p2,f{w},a0,r8"]
    return "_".join(stages)


_VIL = {"vil_ls_medium": (_vil_arch((4, 16), 7), 224), "vil_ls_base": (_vil_arch((8, 24), 7), 224),
        "vil_ls_medium_384": (_vil_arch((4, 16), 8), 384)}

# Agent-Attention (`<root>/Agent-Attention/agent_transformer/models/`, a package: agent_deit imports `.deit`):
# the official cfgs `agent_transformer/cfgs/agent_*.yaml` as constructor arguments.
_AGENT = "Agent-Attention/agent_transformer/models"
_AGENT_DEIT = {"agent_deit_tiny": dict(embed_dim=192, num_heads=3, img_size=224),
               "agent_deit_small": dict(embed_dim=384, num_heads=6, img_size=224),
               "agent_deit_small_448": dict(embed_dim=384, num_heads=6, img_size=448),
               "agent_deit_base": dict(embed_dim=768, num_heads=12, img_size=224, agent_layer=4, agent_num=[81] * 4)}
_AGENT_PVT = {"agent_pvt_tiny": 224, "agent_pvt_small": 224, "agent_pvt_medium": 224, "agent_pvt_medium_256": 256,
              "agent_pvt_large": 224}
# (img_size, embed_dim, depths, heads, WINDOW_SIZE, ATTN_TYPE); NUM 9-16-49-49 in every cfg.
_AGENT_SWIN = {"agent_swin_tiny": (224, 96, (2, 2, 6, 2), (3, 6, 12, 24), 56, "AAAB"),
               "agent_swin_small": (224, 96, (2, 2, 18, 2), (3, 6, 12, 24), 56, "AABB"),
               "agent_swin_small_288": (288, 96, (2, 2, 18, 2), (3, 6, 12, 24), 72, "AABB"),
               "agent_swin_base": (224, 128, (2, 2, 18, 2), (4, 8, 16, 32), 56, "AAMB2"),
               "agent_swin_base_384": (384, 128, (2, 2, 18, 2), (4, 8, 16, 32), 96, "AAMB2")}
_AGENT_CSWIN = {"agent_cswin_tiny": ("Agent_CSWin_64_24181_tiny_224", 224),
                "agent_cswin_small": ("Agent_CSWin_64_36292_small_224", 224),
                "agent_cswin_base": ("Agent_CSWin_96_36292_base_224", 224),
                "agent_cswin_base_384": ("Agent_CSWin_96_36292_base_384", 384)}

OFFICIAL_NAMES: tuple[str, ...] = (*_L2VIT_FNS, *_SWIN, *_PVT, *_PVT_V2, *_CSWIN_FNS, *_VIL, *_POLA_SWIN, *_POLA_PVT,
                                   *_AGENT_DEIT, *_AGENT_PVT, *_AGENT_SWIN, *_AGENT_CSWIN)


def _ls_root(root: str | Path) -> Path:
    """The Transformer-LS checkout: `<root>/transformer-ls`, or `root` itself when it is that checkout."""
    root = Path(root)
    return root / "transformer-ls" if (root / "transformer-ls").is_dir() else root


def official_file(root: str | Path, rel: str) -> Path:
    """`<root>/<rel>`, or a one-line UserError naming the missing file."""
    if not str(root):
        raise UserError(f"no official root given; {ROOT_HINT}")
    path = Path(root) / rel
    if not path.is_file():
        raise UserError(f"official file not found: {path} ({ROOT_HINT})")
    return path


def official_files(root: str | Path, name: str) -> list[Path]:
    """The official source files `build_official(root, name)` needs (each checked to exist)."""
    if name in _L2VIT_FNS:
        return [official_file(root, _L2VIT)]
    if name in _VIL:
        return [official_file(_ls_root(root), rel) for rel in _MSVIT]
    if name in _SWIN or name in _CSWIN_FNS or name in _PVT or name in _PVT_V2:
        return [official_file(root, _FLATTEN.format(_flatten_file(name)))]
    if name in _POLA_SWIN or name in _POLA_PVT:
        return [official_file(root, _POLA.format("pola_swin" if name in _POLA_SWIN else "pola_pvt"))]
    if name in _AGENT_DEIT:
        return [official_file(root, f"{_AGENT}/{f}.py") for f in ("deit", "agent_deit")]
    if name in _AGENT_PVT or name in _AGENT_SWIN or name in _AGENT_CSWIN:
        return [official_file(root, f"{_AGENT}/{name.split('_')[0]}_{name.split('_')[1]}.py")]
    raise UserError(f"no official code for model {name!r}; known: {', '.join(OFFICIAL_NAMES)}")


def _flatten_file(name: str) -> str:
    for prefix in ("flatten_pvt_v2", "flatten_pvt", "flatten_swin", "flatten_cswin"):
        if name.startswith(prefix):
            return prefix
    raise UserError(f"{name!r} is not a FLatten model")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence stdout and warnings (official constructors print their settings)."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class _Rearrange(nn.Module):
    """Stand-in for einops' `Rearrange('b c h w -> b (h w) c', ...)`, the only layer the official files build."""

    def __init__(self, pattern: str, **sizes: int) -> None:
        super().__init__()
        if pattern.split() != "b c h w -> b (h w) c".split():
            raise NotImplementedError(f"einops is not installed and the stand-in cannot do {pattern!r}")

    def forward(self, x):
        return x.flatten(2).transpose(1, 2)


def _rearrange(*args, **kwargs):
    raise NotImplementedError("einops is not installed: the stand-in has no rearrange()")


def _einops_stand_in() -> dict[str, types.ModuleType]:
    ein, layers, torch_layers = (types.ModuleType(n) for n in ("einops", "einops.layers", "einops.layers.torch"))
    ein.rearrange, ein.layers, layers.torch, torch_layers.Rearrange = _rearrange, layers, torch_layers, _Rearrange
    return {"einops": ein, "einops.layers": layers, "einops.layers.torch": torch_layers}


@contextlib.contextmanager
def _official_import_env() -> Iterator[None]:
    """No timm registration, an einops stand-in when einops is missing (removed afterwards), quiet."""
    import timm.models
    import timm.models._registry as _registry

    added = {}
    if "einops" not in sys.modules and importlib.util.find_spec("einops") is None:
        added = _einops_stand_in()
        sys.modules.update(added)
    with quiet():
        import timm.models.registry as registry

    def no_register(fn=None, **kwargs):
        return fn if fn is not None else (lambda f: f)

    targets = [(m, "register_model") for m in (timm.models, registry, _registry)]
    saved = [getattr(m, a) for m, a in targets]
    try:
        for m, a in targets:
            setattr(m, a, no_register)
        with quiet():
            yield
    finally:
        for (m, a), v in zip(targets, saved):
            setattr(m, a, v)
        for k in added:
            if sys.modules.get(k) is added[k]:
                del sys.modules[k]


_LOADED: dict[tuple[str, str], types.ModuleType] = {}


def load_module(path: str | Path, name: str) -> types.ModuleType:
    """Execute the Python file `path` as module `name` (kept in `sys.modules`; loaded once per path and name).

    Args:
        path: the official source file.
        name: a module name that cannot clash with a real package (e.g. `_official_l2vit`).
    Returns:
        the module.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"official file not found: {path} ({ROOT_HINT})")
    key = (str(path.resolve()), name)
    if key in _LOADED:
        return _LOADED[key]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        with _official_import_env():
            spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _LOADED[key] = mod
    return mod


def load_l2vit(root: str | Path) -> types.ModuleType:
    """The official `L2ViT/classification/models/l2vit.py`."""
    return load_module(official_file(root, _L2VIT), "_official_l2vit")


def load_flatten(root: str | Path, file: str) -> types.ModuleType:
    """An official FLatten model file: `file` is `flatten_swin`, `flatten_cswin`, `flatten_pvt` or `flatten_pvt_v2`."""
    return load_module(official_file(root, _FLATTEN.format(file)), f"_official_{file}")


def load_pola(root: str | Path, file: str) -> types.ModuleType:
    """An official PolaFormer model file: `file` is `pola_swin` or `pola_pvt`."""
    return load_module(official_file(root, _POLA.format(file)), f"_official_{file}")


def load_msvit(root: str | Path) -> types.ModuleType:
    """The official Transformer-LS `imagenet/models/msvit.py` with its `layers` package (whose `__init__` and the
    models package's torchvision import are skipped: the package is assembled from the two layer files)."""
    full, ls, msvit = (official_file(_ls_root(root), rel) for rel in _MSVIT)
    key = (str(msvit.resolve()), "_off_vil.msvit")
    if key in _LOADED:
        return _LOADED[key]
    for pkg_name in ("_off_vil", "_off_vil.layers"):
        pkg = types.ModuleType(pkg_name)
        pkg.__path__ = []
        sys.modules[pkg_name] = pkg
    layers = sys.modules["_off_vil.layers"]
    layers.Attention = load_module(full, "_off_vil.layers.full_attention").Attention
    layers.AttentionLS = load_module(ls, "_off_vil.layers.transformer_ls").AttentionLS
    return load_module(msvit, "_off_vil.msvit")


def load_agent(root: str | Path, file: str) -> types.ModuleType:
    """An official Agent-Attention model file (`agent_deit`, `agent_pvt`, `agent_swin`, `agent_cswin`), imported as
    `_official_agent.<file>` of a package over the official `models/` folder (its relative imports resolve there;
    the folder's `__init__`, which imports every file, is not run)."""
    path = official_file(root, f"{_AGENT}/{file}.py")
    if "_official_agent" not in sys.modules:
        pkg = types.ModuleType("_official_agent")
        pkg.__path__ = [str(path.parent)]
        sys.modules["_official_agent"] = pkg
    if file == "agent_deit":
        load_module(path.parent / "deit.py", "_official_agent.deit")
    return load_module(path, f"_official_agent.{file}")


def build_official(root: str | Path, name: str, img_size: int | None = None, **kwargs) -> nn.Module:
    """Build the official model matching our registered `name` (random init, train mode, CPU), quietly.

    Args:
        root: folder of the official checkouts.
        name: one of `OFFICIAL_NAMES`.
        img_size: construction resolution (default: the variant's). FLatten-Swin's focused-attention window and
            FLatten-CSwin's `la_split_size` follow it (the whole stage grid, as the official 224 and 384 configs).
        **kwargs: passed to the official constructor (e.g. num_classes).
    Returns:
        the official nn.Module.
    """
    official_files(root, name)
    with quiet():
        return _builder(root, name, img_size)(**kwargs)


def _builder(root: str | Path, name: str, img_size: int | None) -> Callable[..., nn.Module]:
    if name in _L2VIT_FNS:
        # L2ViT runs at any size; its constructor takes no resolution.
        return getattr(load_l2vit(root), _L2VIT_FNS[name])
    if name in _SWIN:
        embed_dim, depths, heads, size = _SWIN[name]
        size = img_size or size
        return partial(load_flatten(root, "flatten_swin").FLattenSwinTransformer, img_size=size, embed_dim=embed_dim,
                       depths=list(depths), num_heads=list(heads), window_size=size // 4, attn_type="LLSS")
    if name in _CSWIN_FNS:
        fn, size = _CSWIN_FNS[name]
        g = (img_size or size) // 4
        return partial(getattr(load_flatten(root, "flatten_cswin"), fn), img_size=img_size or size,
                       la_split_size=f"{g}-{g // 2}-{g // 4}-{g // 8}", attn_type="LLSS")
    if name in _PVT or name in _PVT_V2:
        mod = load_flatten(root, "flatten_pvt_v2" if name in _PVT_V2 else "flatten_pvt")
        extra = {"img_size": img_size} if img_size else {}
        return partial(getattr(mod, name), la_sr_ratios="1111", attn_type="LLLL", **extra)
    if name in _POLA_SWIN:
        embed_dim, depths, heads = _POLA_SWIN[name]
        size = img_size or 224
        return partial(load_pola(root, "pola_swin").PolaSwinTransformer, img_size=size, embed_dim=embed_dim,
                       depths=list(depths), num_heads=list(heads), window_size=size // 4, attn_type="LLSS")
    if name in _POLA_PVT:
        extra = {"img_size": img_size} if img_size else {}
        return partial(getattr(load_pola(root, "pola_pvt"), name), la_sr_ratios="1111", attn_type="LLLL", **extra)
    if name in _AGENT_DEIT:
        kw = dict(_AGENT_DEIT[name])
        if img_size:
            kw["img_size"] = img_size
        return partial(load_agent(root, "agent_deit").VisionTransformer, patch_size=16, depth=12, **kw)
    if name in _AGENT_PVT:
        fn = getattr(load_agent(root, "agent_pvt"), name.removesuffix("_256"))
        return partial(fn, img_size=img_size or _AGENT_PVT[name], attn_type="AAAA", agent_sr_ratios="1111",
                       agent_num=[9, 16, 49, 49])
    if name in _AGENT_SWIN:
        size, embed_dim, depths, heads, window, kinds = _AGENT_SWIN[name]
        if img_size:
            size, window = img_size, img_size // 4
        return partial(load_agent(root, "agent_swin").AgentSwinTransformer, img_size=size, embed_dim=embed_dim,
                       depths=list(depths), num_heads=list(heads), window_size=window, agent_num=[9, 16, 49, 49],
                       attn_type=kinds)
    if name in _AGENT_CSWIN:
        fn, size = _AGENT_CSWIN[name]
        g = (img_size or size) // 4
        return partial(getattr(load_agent(root, "agent_cswin"), fn), img_size=img_size or size, attn_type="AABB",
                       agent_num=[9, 16, 49, 49], la_split_size=f"{g}-{g // 2}-{g // 4}-{g // 8}")
    if name in _VIL:
        arch, size = _VIL[name]
        # launch/eval + config/msvit.yaml + config/defaults.py: norm_embed, shared w / kv, LN eps 1e-6, no avg pool.
        return partial(load_msvit(root).MsViT, arch, img_size=img_size or size, norm_embed=True, sharew=True,
                       attn_type="ls", share_kv=True, only_glo=False, sw_exact=0, ln_eps=1e-6, mode=0,
                       avg_pool=False)
    raise UserError(f"no official code for model {name!r}; known: {', '.join(OFFICIAL_NAMES)}")
