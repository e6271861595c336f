"""Summarize the ncu exports of bench/gemm_gpu_profile.sh: key metrics of each profiled launch
(--page details --csv) and the SASS instructions with the most warp-stall samples (--page source
--csv --print-source sass), each with its top stall reasons and the instructions around it.

    python bench/gemm_ncu_summary.py DIR      # DIR holds ncu_*.details.csv / ncu_*.source.csv
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

KEY_METRICS = ("Duration", "SM Frequency", "Compute (SM) Throughput", "Memory Throughput",
               "L2 Cache Throughput", "DRAM Throughput", "Executed Ipc Active",
               "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "No Eligible",
               "Active Warps Per Scheduler", "Eligible Warps Per Scheduler", "Registers Per Thread")


def _rows(path: Path, header: str = '"'):
    txt = path.read_text(errors="replace")
    start = txt.find(header)
    return list(csv.reader(io.StringIO(txt[start:]))) if start >= 0 else []


def details(path: Path):
    rows = _rows(path)
    if not rows:
        print(f"{path.name}: empty")
        return
    h = rows[0]
    try:
        iname, iunit, ival = h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
        isec = h.index("Section Name")
    except ValueError:
        print(f"{path.name}: unexpected header {h[:12]}")
        return
    print(f"== {path.name}")
    for r in rows[1:]:
        if len(r) <= ival:
            continue
        if r[iname] in KEY_METRICS or r[isec] == "Warp State Statistics" or "Stall" in r[iname]:
            print(f"  {r[isec][:28]:28s} {r[iname][:48]:48s} {r[ival]:>14s} {r[iunit]}")


def source(path: Path, top: int = 40, ctx: int = 3):
    rows = _rows(path, '"Address"')
    if not rows:
        print(f"{path.name}: empty")
        return
    h = rows[0]
    col = {n: i for i, n in enumerate(h)}
    isrc = next((i for n, i in col.items() if n.strip() == "Source"), None)
    iaddr = next((i for n, i in col.items() if "Address" in n), None)
    isamp = next((i for n, i in col.items() if n.startswith("Warp Stall Sampling (All")), None)
    if isrc is None or isamp is None:
        print(f"{path.name}: columns {h[:40]}")
        return
    reasons = [(n, i) for n, i in col.items() if n.startswith("stall_") and "Not Issued" not in n]
    iexec = col.get("Instructions Executed")
    body = [r for r in rows[1:] if len(r) > max(isrc, isamp)]

    def num(v):
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return 0.0
    total = sum(num(r[isamp]) for r in body) or 1.0
    hgmma = sum(1 for r in body if "HGMMA" in r[isrc])
    print(f"== {path.name}: {len(body)} SASS lines, {hgmma} HGMMA, {total:.0f} stall samples")
    order = sorted(range(len(body)), key=lambda k: -num(body[k][isamp]))[:top]
    for k in sorted(order):
        r = body[k]
        rs = sorted(((num(r[i]), n) for n, i in reasons), reverse=True)[:3]
        rs = ", ".join(f"{n.replace('stall_', '')} {v / max(num(r[isamp]), 1):.0%}"
                       for v, n in rs if v > 0)
        ex = r[iexec] if iexec is not None else ""
        print(f"  [{k:5d}] {num(r[isamp]) / total:6.1%} x{ex:>9s} {r[isrc].strip()[:64]:64s} | {rs}")
    # the neighbourhood of the top 8, to place them (mainloop / epilogue / waits)
    for k in sorted(order[:8]):
        print(f"  -- around [{k}]")
        for j in range(max(0, k - ctx), min(len(body), k + ctx + 1)):
            print(f"     [{j:5d}] {num(body[j][isamp]) / total:6.1%} {body[j][isrc].strip()[:90]}")


def main(d: str) -> int:
    d = Path(d)
    for f in sorted(d.glob("ncu_*.details.csv")):
        details(f)
    for f in sorted(d.glob("ncu_*.source.csv")):
        source(f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
