"""A/B summary of launch/bench.py runs: per batch, the megakernel's median step time of an "off"
and an "on" JSON (the same GPU, the same call), the change, p10 / p90 and the commits; printed as
a table and written (or appended) to one JSON that bench/results keeps beside the runs.

    python bench/ab_summary.py --out bench/results/ab_<date>_<session>_summary.json \\
        "split-K QKV + GATE_UP=opcombo_none.json,opcombo_qg.json" "kv_split_min 64=split_0.json,split_64.json"

Each pair is NAME=OFF,ON with paths relative to --dir (default bench/results). --note adds a line
to the summary (and to each pair of this call); --append adds the pairs to an existing summary
instead of replacing it. Where both runs were journaled (`--journal`), each pair also holds the
step's critical path per layer and opcode, off and on (mk.trace.critical_path: each opcode's
share of the chain that ends the step, its runs plus the hops before them, divided by the
model's layers; the shares add up to the step, whereas the runs alone overlap where an
instruction was handed over before the one it follows ended); --path prints it. CPU only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path


def megakernel_ms(path: Path) -> tuple[dict, dict]:
    """{batch: (median, p10, p90) ms} of the megakernel in a launch/bench.py JSON, and its header
    (with `path`: {batch: {opcode: us per layer on the critical path}} of the journaled points)."""
    d = json.loads(path.read_text())
    layers = max(1, int((d.get("shape") or {}).get("layers") or 1))
    out, crit = {}, {}
    for p in d.get("points", []):
        r = p.get("results", {}).get("megakernel", {})
        if r.get("status") == "ok":
            out[int(p["batch"])] = (r["ms"], r.get("p10_ms"), r.get("p90_ms"))
            cp = (r.get("journal") or {}).get("critical_path")
            if cp:
                crit[int(p["batch"])] = {op: (v["run_us"] + v["dep_gap_us"] + v["queue_gap_us"])
                                         / layers for op, v in cp["ops"].items()}
    if not out:
        raise ValueError(f"{path}: no megakernel timing (status ok) in its points")
    return out, dict(commit=d.get("git_commit"), device=d.get("device"), command=d.get("command"),
                     path=crit)


def pair_rows(name: str, off: Path, on: Path) -> dict:
    a, ha = megakernel_ms(off)
    b, hb = megakernel_ms(on)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(f"{name}: {off.name} and {on.name} share no batch size")
    r2 = lambda x: None if x is None else round(x, 3)  # noqa: E731
    rows = [dict(batch=k, off_ms=r2(a[k][0]), on_ms=r2(b[k][0]),
                 change_pct=round(100 * (b[k][0] / a[k][0] - 1), 1),
                 off_p10_p90=[r2(a[k][1]), r2(a[k][2])], on_p10_p90=[r2(b[k][1]), r2(b[k][2])])
            for k in common]
    r1 = lambda x: round(x, 1)  # noqa: E731
    path = {k: {op: [r1(ha["path"][k].get(op, 0.0)), r1(hb["path"][k].get(op, 0.0))]
                for op in sorted(set(ha["path"][k]) | set(hb["path"][k]),
                                 key=lambda o: -max(ha["path"][k].get(o, 0), hb["path"][k].get(o, 0)))}
            for k in common if k in ha["path"] and k in hb["path"]}
    return dict(name=name, off_file=off.name, on_file=on.name, off_commit=ha["commit"],
                on_commit=hb["commit"], device=ha["device"], off_command=ha["command"],
                on_command=hb["command"], rows=rows, critical_path_us_per_layer=path)


def parse_pair(text: str) -> tuple[str, str, str]:
    name, eq, files = text.rpartition("=")
    parts = files.split(",")
    if not eq or not name or len(parts) != 2 or not all(parts):
        raise ValueError(f"{text!r} is not NAME=OFF.json,ON.json")
    return name, parts[0], parts[1]


def format_rows(pairs: list[dict]) -> str:
    lines = [f"{'A/B':<44}{'batch':>6}{'off ms':>10}{'on ms':>10}{'change':>9}"]
    for p in pairs:
        for r in p["rows"]:
            lines.append(f"{p['name'][:43]:<44}{r['batch']:>6}{r['off_ms']:>10.3f}"
                         f"{r['on_ms']:>10.3f}{r['change_pct']:>+8.1f}%")
    return "\n".join(lines)


def format_path(pairs: list[dict]) -> str:
    """The critical path per layer of each journaled batch: opcode, off us, on us."""
    lines = []
    for p in pairs:
        for k, ops in p.get("critical_path_us_per_layer", {}).items():
            off = sum(v[0] for v in ops.values())
            on = sum(v[1] for v in ops.values())
            lines.append(f"{p['name']} B={k}: critical path per layer {off:.1f} -> {on:.1f} us "
                         "(each opcode: its runs + the hops before them)")
            lines += [f"  {op:<16}{v[0]:>8.1f}{v[1]:>8.1f}" for op, v in ops.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", metavar="NAME=OFF.json,ON.json")
    ap.add_argument("--dir", default="bench/results", help="where the JSONs are")
    ap.add_argument("--out", default=None, help="the summary JSON to write")
    ap.add_argument("--append", action="store_true", help="add to --out's existing pairs")
    ap.add_argument("--note", default="", help="a line about how the pairs were run")
    ap.add_argument("--path", action="store_true",
                    help="also print the critical path per layer and opcode (journaled runs)")
    a = ap.parse_args(argv)
    try:
        pairs = []
        for text in a.pairs:
            name, off, on = parse_pair(text)
            pairs.append(dict(pair_rows(name, Path(a.dir) / off, Path(a.dir) / on), note=a.note))
        out = dict(date=datetime.date.today().isoformat(), note=a.note, ab=pairs)
        if a.out and a.append and Path(a.out).exists():
            old = json.loads(Path(a.out).read_text())
            # every call's note is kept (the summary's note joins them, each pair has its own)
            note = "\n".join(n for n in (old.get("note", ""), a.note) if n)
            out = {**old, "note": note, "ab": old.get("ab", []) + pairs}
    except (ValueError, OSError, json.JSONDecodeError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(format_rows(pairs))
    if a.path:
        print(format_path(pairs) or "(no journaled pair: no critical path)")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
