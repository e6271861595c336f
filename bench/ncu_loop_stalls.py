"""Warp-stall samples of one GEMM consumer mainloop, from an Nsight Compute source export
(`ncu -i R.ncu-rep --page source --csv --print-source sass`, or cuda,sass), so that two builds
of the same loop can be compared (bench/GEMM_NOTES.md session 41: the step's build runs the same
K step ~25% slower than the harness's, and its SASS loop is the same instruction for
instruction; an instruction-cache cost would show as `no_inst` samples in the loop).

    python bench/ncu_loop_stalls.py --hgmma 64x112x16 harness.source.csv step.source.csv

The loop: the SASS lines (in address order) from the target of the first backward branch after
the last HGMMA of that shape back to at or before the first one, through that branch; where no
such branch is found, the HGMMAs' span widened by --pad lines. Per file: the loop's lines and
samples, its share of the kernel's samples, samples per executed HGMMA, and the stall reasons'
shares within the loop (all samples; ncu's stall_* columns, as shares of their sum). Also:
`ex/sel`, the loop's warp instructions executed per `selected` sample of it (an issue seen by
the sampler: two exports of the same loop whose ex/sel agree were sampled at the same
interval, so their raw samples compare; session 44), and `cold`, the kernel's no_inst samples
outside the loop as a share of all its samples (code run once per tile waiting for the
instruction cache: session 44 found the step's build 6% longer than a one-slot build on the
same tiles, all of it there)."""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
import sys
from pathlib import Path

BRANCH = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(0x[0-9a-fA-F]+)")


def _text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode(errors="replace")


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def sass_rows(path: Path) -> tuple[list[dict], list[str]]:
    """The export's SASS lines in address order: dicts of address (int), sass (text), samples,
    executed and each stall_* column (all samples); and the stall column names."""
    txt = _text(path)
    start = txt.find('"Address"')
    if start < 0:
        start = txt.find('"Line No"')
    if start < 0:
        raise SystemExit(f"{path}: no source table (expected an `ncu --page source --csv` export)")
    rows = list(csv.reader(io.StringIO(txt[txt.rfind("\n", 0, start) + 1:])))
    head = rows[0]
    iaddr = next(i for i, n in enumerate(head) if n == "Address")
    # the SASS text is the column after the address (a cuda,sass export has two "Source" columns)
    isass = iaddr + 1
    isamp = next(i for i, n in enumerate(head) if n.startswith("Warp Stall Sampling (All"))
    iexec = head.index("Instructions Executed") if "Instructions Executed" in head else None
    stalls = [(n, i) for i, n in enumerate(head) if n.startswith("stall_") and "(Not" not in n]
    out = []
    for r in rows[1:]:
        if len(r) <= max(isass, isamp) or not r[iaddr].startswith("0x"):
            continue
        d = dict(address=int(r[iaddr], 16), sass=r[isass].strip(), samples=_num(r[isamp]),
                 executed=_num(r[iexec]) if iexec is not None else 0.0)
        d.update({n: _num(r[i]) for n, i in stalls})
        out.append(d)
    out.sort(key=lambda d: d["address"])
    return out, [n for n, _ in stalls]


def loop_span(rows: list[dict], shape: str, pad: int = 48) -> tuple[int, int, bool]:
    """[lo, hi] indices of the loop around the HGMMAs of `shape` (module docstring); found: a
    backward branch closed it."""
    hg = [k for k, d in enumerate(rows) if "HGMMA" in d["sass"] and shape in d["sass"]]
    if not hg:
        raise SystemExit(f"no HGMMA.{shape} in the export")
    first, last = hg[0], hg[-1]
    index_of = {d["address"]: k for k, d in enumerate(rows)}
    for k in range(last + 1, len(rows)):
        m = BRANCH.search(rows[k]["sass"])
        if m and int(m.group(1), 16) <= rows[first]["address"]:
            target = int(m.group(1), 16)
            lo = index_of.get(target)
            if lo is None:      # the target line is not in the export: the nearest line after it
                lo = next(j for j, d in enumerate(rows) if d["address"] >= target)
            return lo, k, True
    return max(0, first - pad), min(len(rows) - 1, last + pad), False


def summarize(path: Path, shape: str, pad: int = 48) -> dict:
    rows, stalls = sass_rows(path)
    lo, hi, closed = loop_span(rows, shape, pad)
    loop = rows[lo:hi + 1]
    total = sum(d["samples"] for d in rows) or 1.0
    in_loop = sum(d["samples"] for d in loop)
    hgmma = [d for d in loop if "HGMMA" in d["sass"] and shape in d["sass"]]
    executed = sum(d["executed"] for d in hgmma)
    reasons = {n.replace("stall_", ""): sum(d[n] for d in loop) for n in stalls}
    selected = sum(d.get("stall_selected", 0.0) for d in loop)
    no_inst_outside = (sum(d.get("stall_no_inst", 0.0) for d in rows)
                       - sum(d.get("stall_no_inst", 0.0) for d in loop))
    # shares of the reasons' own sum: ncu's stall_* columns need not add up to its sample count
    by_reason = sum(reasons.values()) or 1.0
    return dict(file=str(path), shape=shape, lines=len(loop), loop_closed_by_branch=closed,
                first_address=hex(loop[0]["address"]), last_address=hex(loop[-1]["address"]),
                samples=in_loop, kernel_share=in_loop / total, hgmma_lines=len(hgmma),
                hgmma_executed=executed,
                samples_per_hgmma=in_loop / executed if executed else None,
                executed_per_selected=(sum(d["executed"] for d in loop) / selected
                                       if selected else None),
                cold_share=no_inst_outside / total,
                reasons={k: v / by_reason for k, v in
                         sorted(reasons.items(), key=lambda kv: -kv[1]) if v > 0})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--hgmma", default="64x112x16",
                    help="the loop's HGMMA shape (GATE_UP gu_m128n112: 64x112x16; m128n256 tiles: "
                         "64x256x16; m128n128: 64x128x16)")
    ap.add_argument("--pad", type=int, default=48)
    ap.add_argument("--json", action="store_true", help="one JSON line per file")
    args = ap.parse_args(argv)
    out = [summarize(f, args.hgmma, args.pad) for f in args.files]
    if args.json:
        for r in out:
            print(json.dumps(r))
        return 0
    names = sorted({k for r in out for k in r["reasons"]},
                   key=lambda k: -max(r["reasons"].get(k, 0) for r in out))[:10]
    print(f"{'file':40s} {'lines':>5s} {'samples':>9s} {'share':>6s} {'/HGMMA':>7s} "
          f"{'ex/sel':>7s} {'cold':>6s} " + " ".join(f"{n[:10]:>10s}" for n in names))
    for r in out:
        per = f"{r['samples_per_hgmma']:.3f}" if r["samples_per_hgmma"] is not None else "-"
        exs = (f"{r['executed_per_selected']:.0f}" if r["executed_per_selected"] is not None
               else "-")
        print(f"{Path(r['file']).name[:40]:40s} {r['lines']:5d} {r['samples']:9.0f} "
              f"{r['kernel_share']:6.1%} {per:>7s} {exs:>7s} {r['cold_share']:6.1%} "
              + " ".join(f"{r['reasons'].get(n, 0):10.1%}" for n in names))
    print("(the loop's stall samples by reason, shares of their sum; share: of the "
          "kernel's samples; /HGMMA: samples per executed HGMMA warp instruction; ex/sel: "
          "executed per selected sample, equal = sampled alike; cold: no_inst outside the "
          "loop, share of the kernel's samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
