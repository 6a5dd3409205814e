"""Model cost at 224, 512 and 1024 px: every registered Tiny/Small subquad model beside timm's softmax baselines.

Protocol (defaults): batch 1, fp32, CPU, forward latency, images/s, peak memory, params and GMACs at 224/512/1024,
with timm's `deit_tiny_patch16_224`, `swin_tiny_patch4_window7_224` (windows padded at 1024 by timm's Swin) and
`pvt_v2_b1` in the same run. Models are taken from the registry at run time (names ending in _tiny/_small and the
papers' small sizes: lisanet_i/_s, hylisanet_s, flatten_pvt_v2_b1, cvt_ls_13), so new families appear without
editing this file. `--backward` adds a training step (forward, loss, backward) per size.

Usage (from the repository root):
    python benchmarks/models.py --overwrite                # -> benchmarks/results/bench-model-<hw>-pt<v>.csv
    python benchmarks/models.py --list                     # print the selected models and exit
    python benchmarks/models.py --model l2vit_tiny flatten_swin_tiny swin_tiny_patch4_window7_224 --img-size 224,1024

Any other `subquad bench model` flag is passed through (`--model` replaces the selection). An existing result file
(the committed one) is replaced only with `--overwrite`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BASELINES = ["deit_tiny_patch16_224", "swin_tiny_patch4_window7_224", "pvt_v2_b1"]
SMALL = re.compile(r"(_tiny|_small)$|^(lisanet_i|lisanet_s|hylisanet_s|flatten_pvt_v2_b1|cvt_ls_13)$")
DEFAULTS = ["--img-size", "224,512,1024", "--batch-size", "1", "--warmup", "1", "--repeats", "5", "--max-time", "600",
            "--max-mem", "16384"]


def selected_models() -> list[str]:
    """Registered Tiny/Small subquad models (no *_micro test variants), then the timm baselines."""
    import subquad

    ours = [m for m in subquad.list_models() if SMALL.search(m) and not m.endswith("_micro")]
    return ours + BASELINES


def main(argv: list[str] | None = None) -> int:
    from subquad.bench.machine import pin_threads_like_bench
    from subquad.bench.sweep import default_result_path
    from subquad_cli.__main__ import main as cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--list" in argv:
        print("\n".join(selected_models()))
        return 0
    args = ["bench", "model", *DEFAULTS]
    if "--model" not in argv:
        args += ["--model", *selected_models()]
    if "--out" not in argv:
        device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
        pin_threads_like_bench(argv)  # the file is named after the threads bench will use
        args += ["--out", str(default_result_path("model", device, ROOT / "benchmarks" / "results"))]
    return cli(args + argv)


if __name__ == "__main__":
    sys.exit(main())
