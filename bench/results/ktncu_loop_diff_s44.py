"""Session 44 ktncu: per-SASS-instruction diff of the GATE_UP consumer loop (HGMMA.64x112x16)
between the full and the lean build's ncu source exports, plus the hottest regions outside it.
    python bench/results/ktncu_loop_diff_s44.py   (from the repo root; CPU only)"""
import difflib, re, sys
from pathlib import Path
sys.path.insert(0, "bench")
from ncu_loop_stalls import sass_rows, loop_span  # noqa: E402

R = Path("bench/results")
F = {b: R / f"ncu_ktncu_{b}_source_74c1763_2026-12-05_s44.csv.gz" for b in ("full", "lean")}
COLS = ["wait", "dispatch", "selected", "branch_resolving", "long_sb", "short_sb", "math",
        "not_selected", "mio", "no_inst", "barrier"]
SHORT = ["wait", "disp", "sel", "br_res", "long", "short", "math", "nsel", "mio", "noi", "bar"]
BRA = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(0x[0-9a-fA-F]+)")


def op(s):  # mnemonic with modifiers, predicate stripped
    t = s.split()
    return (t[1] if t[0].startswith("@") else t[0]).rstrip(",;")


def reasons(d):
    return " | ".join(f"{d['stall_' + c]:.0f}" for c in COLS)


def load(b):
    rows, _ = sass_rows(F[b])
    lo, hi, _ = loop_span(rows, "64x112x16")
    return rows, lo, hi


D = {b: load(b) for b in F}
L = {b: D[b][0][D[b][1]:D[b][2] + 1] for b in F}
base = {b: D[b][0][D[b][1]]["address"] for b in F}
print("## normalisation")
for b in F:
    rows, lo, hi = D[b]
    tot = sum(d["samples"] for d in rows); ls = sum(d["samples"] for d in L[b])
    ex = sum(d["executed"] for d in L[b]); se = sum(d["stall_selected"] for d in L[b])
    print(f"{b}: kernel samples {tot:.0f}, loop {ls:.0f} ({ls / tot:.1%}), loop lines {len(L[b])}, "
          f"loop warp-instr executed {ex:.0f}, loop selected {se:.0f}, executed/selected "
          f"{ex / se:.0f}, HGMMA executed {sum(d['executed'] for d in L[b] if 'HGMMA' in d['sass']):.0f}")

# --- 2. opcode sequence diff
ops = {b: [op(d["sass"]) for d in L[b]] for b in F}
sm = difflib.SequenceMatcher(None, ops["full"], ops["lean"], autojunk=False)
pair = {}  # full loop index -> lean loop index
print("\n## opcode diff (full vs lean)")
for tag, i1, i2, j1, j2 in sm.get_opcodes():
    if tag == "equal":
        pair.update({i1 + k: j1 + k for k in range(i2 - i1)})
    else:
        print(tag, "full:", [(hex(L['full'][i]['address'] - base['full']), L['full'][i]['sass'])
                             for i in range(i1, i2)],
              "lean:", [(hex(L['lean'][j]['address'] - base['lean']), L['lean'][j]['sass'])
                        for j in range(j1, j2)])
# twins for the tables: greedy matching of same-opcode lines of the same execution class (every K
# step / slow path / never), nearest position first (the two builds schedule the hot path
# differently: a sequence diff leaves many lines unpaired)
cls = lambda d: 2 if d["executed"] >= 260096 else (1 if d["executed"] > 0 else 0)
cand = sorted((abs(i - j), i, j) for i, a in enumerate(L["full"]) for j, c in enumerate(L["lean"])
              if op(a["sass"]) == op(c["sass"]) and cls(a) == cls(c) and abs(i - j) < 64)
pair, used = {}, set()
for _, i, j in cand:
    if i not in pair and j not in used:
        pair[i] = j; used.add(j)
rpair = {v: k for k, v in pair.items()}
# hot path (executed every K step) opcode multisets
from collections import Counter  # noqa: E402
hot = {b: Counter(op(d["sass"]) for d in L[b] if d["executed"] >= 260096) for b in F}
print("hot-path lines", {b: sum(hot[b].values()) for b in F}, "full-only", dict(hot["full"] - hot["lean"]),
      "lean-only", dict(hot["lean"] - hot["full"]))
for b in F:
    n = [int(d["executed"]) for d in L[b] if d["executed"] > 0 and "TRYWAIT" in d["sass"]]
    print(b, "TRYWAIT executions in the loop span (first = the full-barrier wait):", n)

# --- 1. top 15 by samples per build, side by side with the aligned twin
hdr = "| off | SASS | samples | twin | " + " | ".join(SHORT[:-1]) + " |"
for b, o in (("full", "lean"), ("lean", "full")):
    pm = pair if b == "full" else rpair
    print(f"\n## top 15 loop instructions, {b} (twin = aligned {o} line)\n{hdr}")
    print("|" + "---|" * (3 + len(COLS)))
    top = sorted(range(len(L[b])), key=lambda k: -L[b][k]["samples"])[:15]
    for k in top:
        d = L[b][k]; t = pm.get(k)
        ts = f"{L[o][t]['samples']:.0f}" if t is not None else "-"
        print(f"| {d['address'] - base[b]:#x} | `{d['sass'][:34]}` | "
              f"{d['samples']:.0f} | {ts} | {reasons(d).rsplit(' | ', 1)[0]} |")

# deltas of the two reasons that grew, per aligned pair
for c in ("branch_resolving", "long_sb", "wait", "math", "not_selected"):
    col = "stall_" + c
    dl = sorted(((L["full"][i][col] - L["lean"][j][col], i, j) for i, j in pair.items()),
                key=lambda t: -abs(t[0]))
    tf = sum(d[col] for d in L["full"]); tl = sum(d[col] for d in L["lean"])
    print(f"\n## {c}: loop total full {tf:.0f} lean {tl:.0f}; largest per-instruction deltas")
    for dv, i, j in dl[:8]:
        print(f"  {dv:+5.0f}  full {L['full'][i][col]:4.0f} lean {L['lean'][j][col]:4.0f}  "
              f"[{i}] {L['full'][i]['sass'][:60]}")

# --- 4. roles (warp 0 controller, 1 loader, 2-3 storer, 4-11 consumers: mk/megakernel.py), found by
# the role dispatch branches' executed counts (132 CTAs: 1584 = all 12 warps, 528 = the producer
# warpgroup, 396 = loader + storer), then regions: innermost backward-branch loop, else straight run
def roles(rows):
    idx = {d["address"]: k for k, d in enumerate(rows)}
    tgt = lambda k: idx[int(BRA.search(rows[k]["sass"]).group(1), 16)]
    isb = lambda k, n: BRA.search(rows[k]["sass"]) and rows[k]["executed"] == n
    k0 = next(k for k in range(len(rows)) if isb(k, 1584) and rows[k + 1]["executed"] == 528)
    k1 = next(k for k in range(k0, len(rows)) if isb(k, 528))          # -> loader + storer
    k2 = next(k for k in range(k1, len(rows)) if isb(k, 132) and rows[tgt(k)]["executed"] == 1584)
    k3 = next(k for k in range(tgt(k1), len(rows)) if isb(k, 396))     # -> storer
    b = [("prologue", 0), ("controller", k0 + 1), ("loader", tgt(k1)), ("storer", tgt(k3)),
         ("consumers", tgt(k0)), ("exit (all warps)", tgt(k2)), ("", len(rows))]
    return [(n, s, e) for (n, s), (_, e) in zip(b, b[1:])]


for b in F:
    rows, lo, hi = D[b]
    tot = sum(d["samples"] for d in rows)
    rl = roles(rows)
    role_of = lambda k: next(n for n, s, e in rl if s <= k < e)
    print(f"\n## roles, {b} (kernel {tot:.0f} samples)")
    print("| role | lines | samples | share | " + " | ".join(SHORT) + " |")
    for n, s, e in rl + [("  consumers: K loop", lo, hi + 1)]:
        seg = rows[s:e]; sm_ = sum(d["samples"] for d in seg)
        print(f"| {n} | {s}-{e - 1} | {sm_:.0f} | {sm_ / tot:.1%} | "
              + " | ".join(f"{sum(d['stall_' + c] for d in seg):.0f}" for c in COLS) + " |")
    idx = {d["address"]: k for k, d in enumerate(rows)}
    loops = []
    for k, d in enumerate(rows):
        m = BRA.search(d["sass"])
        if m and int(m.group(1), 16) <= d["address"] and int(m.group(1), 16) in idx:
            loops.append((idx[int(m.group(1), 16)], k))
    key, run = {}, None
    for k in range(len(rows)):
        inner = [(e - s, s, e) for s, e in loops if s <= k <= e]
        if inner:
            key[k] = ("loop",) + min(inner)[1:]; run = None
        else:
            if run is None:
                run = k
            key[k] = ("run", run)
    agg = {}
    for k, d in enumerate(rows):
        a = agg.setdefault(key[k], {"samples": 0, "lines": [], **{c: 0 for c in COLS}, "maxexec": 0, "ops": set()})
        a["samples"] += d["samples"]; a["lines"].append(k); a["maxexec"] = max(a["maxexec"], d["executed"])
        for c in COLS:
            a[c] += d["stall_" + c]
        o = op(d["sass"]).split(".")[0]
        if o in ("UTMALDG", "UTMASTG", "HGMMA", "LDG", "NANOSLEEP", "BAR", "ATOMG", "RED") or "TRYWAIT" in d["sass"]:
            a["ops"].add(o if "TRYWAIT" not in d["sass"] else "TRYWAIT[" + d["sass"].split("[")[1].split("]")[0] + "]")
    print(f"\n## top 10 regions, {b} (loop = innermost backward-branch loop, its inner loops excluded; run = straight code)")
    print("| region | role | lines | samples | share | max exec | " + " | ".join(SHORT) + " | marks |")
    for kk, a in sorted(agg.items(), key=lambda t: -t[1]["samples"])[:10]:
        l0, l1 = a["lines"][0], a["lines"][-1]
        print(f"| {kk[0]} {l0}-{l1} | {role_of(l0)} | {len(a['lines'])} | {a['samples']:.0f} | {a['samples'] / tot:.1%} | "
              f"{a['maxexec']:.0f} | " + " | ".join(f"{a[c]:.0f}" for c in COLS) + f" | {' '.join(sorted(a['ops']))[:70]} |")
