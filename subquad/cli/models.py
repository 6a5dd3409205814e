"""`subquad models`: the registry as a table, our measured params/GMACs beside the card's."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("models", help="list registered models with their cards",
                       description="List subquad's models: the card's published params/GMACs/top-1 and our own "
                       "counts (meta device), flagging gaps over 1 %.")
    p.add_argument("--filter", default="", help="glob or substring of model names")
    p.add_argument("--unofficial", action="store_true", help="only models whose architecture we reconstructed")
    p.add_argument("--no-count", action="store_true", help="skip measuring params and GMACs (faster)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import subquad
    from subquad.models import get_card

    names = subquad.list_models(args.filter)
    if args.unofficial:
        names = [n for n in names if get_card(n).status == "unofficial"]
    if not names:
        raise subquad.UserError(f"no model matches filter {args.filter!r}; try `subquad models` for all")
    hdr = f"{'model':28s} {'status':13s} {'res':>4s} {'params(M)':>10s} {'card':>8s} {'GMACs':>8s} {'card':>8s} " \
          f"{'top-1':>6s}  flag"
    print(hdr)
    print("-" * len(hdr))
    for n in names:
        c = get_card(n)
        params = gmacs = None
        if not args.no_count:
            r = subquad.count_macs(n, c.img_size)
            params, gmacs = r["params"] / 1e6, r["gmacs"]
        ref_p = c.ref_params / 1e6 if c.ref_params else c.params_m
        ref_g = c.ref_gmacs or c.gmacs
        flag = []
        if params is not None and ref_p and abs(params - ref_p) / ref_p > 0.01:
            flag.append("params")
        if gmacs is not None and ref_g and abs(gmacs - ref_g) / ref_g > 0.01:
            flag.append("gmacs")

        def f(v, spec):
            return format(v, spec) if v is not None else "-"

        print(f"{n:28s} {c.status:13s} {c.img_size:4d} {f(params, '10.2f')} {f(ref_p, '8.2f')} {f(gmacs, '8.2f')} "
              f"{f(ref_g, '8.2f')} {f(c.top1, '6.1f')}  {'GAP>1%: ' + ','.join(flag) if flag else ''}")
    return 0
