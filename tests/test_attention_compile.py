"""Compile gate (CPU, CI) of the ATTENTION / ATTN_REDUCE bodies (mk/instructions/_attention_kernel.py),
compiled into the standalone harness kernel (bench/attention.py) with the megakernel's roles, per KV
page size variant (TMA sub-boxes of min(page_size, 64) rows): the PTX holds the RS wgmma
(m64n64k16, A from registers) of QK^T and PV, the TMA loads of the K/V pages, setmaxnreg, the
release signal and bounded mbarrier waits; no function calls; ptxas reports no spills, no stack
frame and no C7506/C7508/C7510; setmaxnreg fits the launch's registers."""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.compile

from _compile_gate import (BAD_PTXAS, assert_clean, dump_dir, ptxas_report,  # noqa: F401
                           probe_module, swapped_probe)  # (env set first)

REQUIRED_PTX = {
    "wgmma.mma_async (RS, bf16)": r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16",
    "cp.async.bulk.tensor (K/V pages)": r"cp\.async\.bulk\.tensor",
    "setmaxnreg.inc": r"setmaxnreg\.inc",
    "setmaxnreg.dec": r"setmaxnreg\.dec",
    "release signal": r"red\.release\.gpu",
    "mbarrier try_wait": r"mbarrier\.try_wait",
    "ex2 (softmax)": r"ex2\.approx",
    "proxy fence (V tail zeroing / TMA after generic reads)": r"fence\.proxy\.async",
}
# QK^T: 2 halves of D x 4 k16 blocks; PV: 2 halves of D x 4 k16 blocks
WGMMA = 16
# the swapped decode chain (ak.SWAPPED, the default; not beside wg_split): S^T = K Q^T, 8
# m64n8k16 K-major; O^T = V^T P^T, 8 m64n8k16 with the V page read M-major (tnspA 1)
SWAP_MODES = {("m64n8k16", 0, 0): 8, ("m64n8k16", 1, 0): 8}
SWAP_WGMMA = sum(SWAP_MODES.values())
# page size -> TMA copies in the PTX (K/V page: 2 halves x 64 / min(ps, 64) sub-boxes, one loop
# body emitted for K and one for V)
# (page size, TMA copies, hand-off, wg_split: decode units split between the consumer WGs)
CASES = [(16, 16, "thread", False), (16, 16, "warp", False), (64, 4, "thread", False),
         (256, 4, "thread", False), (16, 16, "thread", True), (16, 16, "warp", True),
         (64, 4, "thread", True)]


def test_host_mirror_of_the_unit_ranges():
    pytest.importorskip("cutlass")
    from mk.instructions import _attention_kernel as ak
    # decode: one row, 8 q heads: one M tile, ceil(ctx / 64) blocks
    assert ak.unit_blocks_host(1, 8, 1000, 0, 1024, 0) == -(-1001 // 64)
    # a split after every row of the tile: no block
    assert ak.unit_blocks_host(16, 8, 10, 1024, 2048, 0) == 0
    # prefill 128 rows x qpk 8 = 8 M tiles, causal bound per tile
    assert [ak.unit_blocks_host(128, 8, 0, 0, 1024, mt) for mt in range(8)] == \
        [1, 1, 1, 1, 2, 2, 2, 2]
    assert ak.pages_per_instr(1, 8, 1, 100, 0, 101, 0) == 2 * 2 + ak.E_DIRECT
    # a pair (mode 2): both units' K / V pages (2 and 4 blocks), one set of epilogue pages
    from mk.instructions import attention as at
    assert ak.pages_per_instr(1, 8, 1, 100, 0, 101, at.MODE_PAIR, pos0_b=200) == \
        2 * 2 + 2 * 4 + ak.E_DIRECT


@pytest.mark.parametrize("page_size,tma,handoff,wg_split", CASES,
                         ids=[f"page{p}-{h}-split{int(w)}" for p, _, h, w in CASES])
def test_attention_bodies_compile_for_sm90a(dump_dir, page_size, tma, handoff, wg_split):
    """handoff: the done/empty arrivals (share 256 = every thread, the megakernel's default;
    8 = one per warp). wg_split: both variants of attn_consume (the split one's decode units run
    the m64n64 chain, split between the warpgroups; the other's the swapped chain)."""
    from bench.attention import LAUNCH_REGS, REG_HIGH, REG_LOW, THREADS, compile_fake
    from mk.instructions import _attention_kernel as ak
    comp = compile_fake(page_size, handoff=handoff, wg_split=wg_split)
    ptx = comp.__ptx__
    assert ptx, "no PTX kept"
    missing = [k for k, rx in REQUIRED_PTX.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    n = len(re.findall(r"wgmma\.mma_async", ptx))
    want = WGMMA + (0 if wg_split else SWAP_WGMMA)
    assert n == want, f"{n} wgmma.mma_async in the PTX, expected {want}"
    modes = swapped_probe().wgmma_modes(ptx)
    assert all(modes.get(k, 0) == (0 if wg_split else v) for k, v in SWAP_MODES.items()), modes
    # the A operand comes from registers (RS): the wgmma takes a register vector, not a descriptor
    assert re.search(r"wgmma\.mma_async[^;]*\{[^}]*\},\s*\{%r", ptx), "QK^T / PV are not RS wgmma"
    wg_bars = {int(b) for b in re.findall(r"bar\.sync\s+(\d+),\s*128;", ptx)}
    # warpgroup-local named barriers: wg_split's V tails, the swapped chain's Q^T / P^T
    assert wg_bars == set(ak.BAR_ATTN_WG), wg_bars
    nt = len(re.findall(r"cp\.async\.bulk\.tensor", ptx))
    assert nt == tma, f"{nt} TMA copies in the PTX, expected {tma}"
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel (C7506/C7510)"
    work = os.path.join(dump_dir, f"attn_page{page_size}_{handoff}_split{int(wg_split)}")
    os.makedirs(work, exist_ok=True)
    rep = ptxas_report(ptx, work)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)
    if wg_split and handoff == "warp" and ak.REDUCE_WIDE:
        # known (session 10): with the wide ATTN_REDUCE (the default) beside the split decode
        # units, the harness's warp hand-off variant spills 4 bytes; wg_split is off by default
        # and not in the megakernel. Any other spill, or a larger one, still fails.
        assert spills and all(int(a) <= 4 and int(b) <= 4 for a, b in spills), rep
    else:
        assert spills and all(a == "0" and b == "0" for a, b in spills), rep
        stack = re.findall(r"(\d+) bytes stack frame", rep)
        assert all(s == "0" for s in stack), rep
    used = [int(v) for v in re.findall(r"Used (\d+) registers", rep)]
    assert used and 128 * REG_LOW + 256 * REG_HIGH <= THREADS * max(used) <= THREADS * LAUNCH_REGS
    bad = [c for c in BAD_PTXAS if c in rep]
    assert not bad, f"ptxas warned {bad}:\n{rep}"
    print(f"page_size {page_size} {handoff} wg_split {int(wg_split)}:", [ln.strip() for ln in rep.splitlines()
                                      if "registers" in ln or "spill" in ln])


# Leave-one-out experiment variants (ak.EXPERIMENT, MK_ATTN_EXPERIMENT, read at import: compiled in
# a subprocess; bench/attention.py --experiments times them): each compiles clean (no spill) and
# its PTX lacks exactly the work it leaves out. Page 16, thread hand-off (the megakernel's).
EXPERIMENT_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
from bench.attention import compile_fake
from mk.instructions import _attention_kernel as ak
assert ak.EXPERIMENT == frozenset({parts!r}), ak.EXPERIMENT
open({out!r}, "w").write(compile_fake(16, handoff="thread").__ptx__)
"""


def _counts(ptx: str) -> dict:
    return dict(wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
                tma=len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                st_global=len(re.findall(r"st\.global", ptx)),
                ld_global=len(re.findall(r"ld\.global", ptx)),
                ex2=len(re.findall(r"ex2\.approx", ptx)))


@pytest.fixture(scope="module")
def default_counts():
    from bench.attention import compile_fake
    from mk.instructions import _attention_kernel as ak
    assert not ak.EXPERIMENT, f"MK_ATTN_EXPERIMENT is set in the test process: {set(ak.EXPERIMENT)}"
    return _counts(compile_fake(16, handoff="thread").__ptx__)


@pytest.mark.parametrize("experiment", ["noload", "nomath", "nostore"])
def test_attention_experiment_variants_compile(dump_dir, default_counts, tmp_path, experiment):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = str(tmp_path / "exp.ptx")
    env = dict(os.environ, MK_ATTN_EXPERIMENT=experiment, CUTE_DSL_ARCH="sm_90a")
    r = subprocess.run([sys.executable, "-c", EXPERIMENT_SCRIPT.format(
        root=root, parts=experiment.split(","), out=out)], env=env, capture_output=True,
        text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    ptx = open(out).read()
    got, ref = _counts(ptx), default_counts
    assert got != ref
    if experiment == "noload":       # no K/V TMA; the math stays
        assert got["tma"] == 0 < ref["tma"] and got["wgmma"] == ref["wgmma"] == WGMMA + SWAP_WGMMA, got
        assert got["ld_global"] < ref["ld_global"], (got, ref)      # no page-table loads
    elif experiment == "nomath":     # no wgmma, softmax exps only in ATTN_REDUCE; loads all kept
        assert got["wgmma"] == 0 and got["tma"] == ref["tma"], got
        assert got["ex2"] < ref["ex2"] and got["ld_global"] == ref["ld_global"], (got, ref)
    else:                            # nostore: fewer global stores; loads and math stay
        assert got["st_global"] < ref["st_global"], (got, ref)
        assert got["tma"] == ref["tma"] and got["wgmma"] == ref["wgmma"], got
    # the page protocol stays: mbarrier waits and the release signal are still there
    assert re.search(r"mbarrier\.try_wait", ptx) and re.search(r"red\.release\.gpu", ptx)
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    from _compile_gate import assert_clean
    work = os.path.join(dump_dir, f"attn_exp_{experiment}")
    rep = ptxas_report(ptx, work)
    if experiment == "nomath":
        # a probe, not a build anyone runs: with the compact waits (the default since session 44)
        # ptxas spills 16 bytes in it (8 stack, 124 bytes of reloads); its leave-one-out time
        # carries that, so the bound is tight and the spill says so here, not hidden
        spills = [(int(a), int(b)) for a, b in
                  re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep)]
        assert spills and all(st <= 16 and ld <= 128 for st, ld in spills), rep
        print(f"experiment nomath: {got} (default {ref}), spills {spills}")
        return
    regs = assert_clean(rep)
    print(f"experiment {experiment}: {got} (default {ref}), {regs} registers, 0 spills")


NARROW_REDUCE_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, os.path.join({root!r}, "tests"))
from bench.attention import compile_fake
from mk.instructions import _attention_kernel as ak
import mk.megakernel as M
assert not ak.REDUCE_WIDE
open({out!r} + ".harness", "w").write(compile_fake(16, handoff="thread").__ptx__)
open({out!r} + ".m64", "w").write(M.compile_fake(gemm=M.class_slots(64), attn_page_size=16,
                                                 gather=True, splitk=True).__ptx__)
"""


def test_narrow_reduce_compiles_clean(dump_dir, default_counts, tmp_path):
    """ATTN_REDUCE's wide mapping (a decode token's rows on every consumer thread, eight splits'
    loads at a time) is the default since session 10; MK_ATTN_REDUCE_WIDE=0 builds the 64-row
    mapping for every page (read at import, so in a subprocess): the harness and the
    megakernel's all-opcode M64 variant compile without spills or calls; the default harness has
    the wide path's extra global loads and exp2s beside the 64-row path's, and the attention
    body is the same in both (same wgmma and TMA)."""
    import subprocess
    import sys
    from mk.instructions import _attention_kernel as ak
    assert ak.REDUCE_WIDE, "the wide ATTN_REDUCE is the default"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = str(tmp_path / "narrow")
    env = dict(os.environ, MK_ATTN_REDUCE_WIDE="0", CUTE_DSL_ARCH="sm_90a")
    r = subprocess.run([sys.executable, "-c", NARROW_REDUCE_SCRIPT.format(root=root, out=out)],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    from _compile_gate import assert_clean
    for kind in ("harness", "m64"):
        ptx = open(f"{out}.{kind}").read()
        assert not re.search(r"^\s*call", ptx, flags=re.M), f"function calls in the {kind} kernel"
        regs = assert_clean(ptxas_report(ptx, os.path.join(dump_dir, f"attn_narrow_reduce_{kind}")))
        if kind == "harness":
            got, ref = _counts(ptx), default_counts
            assert got["wgmma"] == ref["wgmma"] and got["tma"] == ref["tma"], (got, ref)
            assert got["ex2"] < ref["ex2"] and got["ld_global"] < ref["ld_global"], (got, ref)
        print(f"narrow reduce, {kind}: {regs} registers, 0 spills")


STORE_MODE_SCRIPT = """
import os, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, os.path.join({root!r}, "tests"))
from bench.attention import compile_fake
from mk.instructions import _attention_kernel as ak
assert ak.STORE_MODE == {mode!r}
open({out!r}, "w").write(compile_fake(16, handoff="thread").__ptx__)
"""


@pytest.mark.parametrize("mode", ["unrolled", "bulk"])
def test_store_modes_compile_clean(dump_dir, default_counts, tmp_path, mode):
    """MK_ATTN_STORE (the storer's epilogue copy; read at import, so in a subprocess): the default
    "loop" keeps the 16-byte stores in a loop that is not unrolled; "unrolled" (the default until
    session 8) unrolls them (far more st.global in the code), "bulk" copies rows with
    cp.async.bulk (shared -> global) behind proxy fences; all leave the attention math and loads
    alone and compile without spills or calls."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = str(tmp_path / f"store_{mode}.ptx")
    env = dict(os.environ, MK_ATTN_STORE=mode, CUTE_DSL_ARCH="sm_90a")
    r = subprocess.run([sys.executable, "-c", STORE_MODE_SCRIPT.format(root=root, mode=mode,
                                                                        out=out)],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    ptx = open(out).read()
    got, ref = _counts(ptx), default_counts
    assert got["wgmma"] == ref["wgmma"] and got["tma"] == ref["tma"], (got, ref)
    assert got["ex2"] == ref["ex2"], (got, ref)
    if mode == "unrolled":
        # 16 chunks x 7 pages of the storer bodies (2 + 4 + 1), against the loop's one per page
        assert got["st_global"] >= ref["st_global"] + 96, (got, ref)
    else:
        assert got["st_global"] < ref["st_global"], (got, ref)
    bulk = len(re.findall(r"cp\.async\.bulk\.global\.shared::cta", ptx))
    assert (bulk > 0) == (mode == "bulk"), bulk
    if mode == "bulk":
        assert re.search(r"cp\.async\.bulk\.wait_group\.read", ptx)
        assert re.search(r"fence\.proxy\.async\.global", ptx)
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    from _compile_gate import assert_clean
    regs = assert_clean(ptxas_report(ptx, os.path.join(dump_dir, f"attn_store_{mode}")))
    print(f"store mode {mode}: {got} (default {ref}), {bulk} bulk copies, {regs} registers")


@pytest.mark.parametrize("var,value", [("MK_ATTN_STORE", "fast"), ("MK_ATTN_SWAP_SPLIT", "2")])
def test_compile_switches_refuse_unknown_values(var, value):
    """A compile-time switch (read at import) with a value it does not know stops the import and
    names the variable and the value."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **{var: value})
    r = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {root!r}); "
                        "import mk.instructions._attention_kernel"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and f"{var}={value!r}" in r.stderr, r.stderr[-2000:]


def test_swapped_decode_probe_compiles_with_keys_on_m(dump_dir):
    """bench/probes/swapped_decode_probe.py (the next decode-attention lever, bench/ATTENTION_NOTES.md
    session 30): S^T = K Q^T and O^T = V^T P^T compile to m64n8k16 chains, the first with K and Q
    K-major, the second reading the V block M-major (tnspA 1), with no spills."""
    probe = swapped_probe()
    ptx = probe.compile_ptx(4)
    # 128 / 16 K steps of S^T; 2 M tiles x 64 / 16 K steps of O^T
    assert probe.wgmma_modes(ptx) == {("m64n8k16", 0, 0): 8, ("m64n8k16", 1, 0): 8}
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx, os.path.join(dump_dir, "swapped_probe")))


def test_racecheck_named_barrier_probe_compiles():
    """bench/probes/racecheck_named_barrier_probe.py (session 31's racecheck hypothesis, run by
    gpu_next's `swaprace`): each variant compiles with exactly its named barriers."""
    probe = probe_module("racecheck_named_barrier_probe")
    want = {"plain": {"1"}, "asym": {"1", "5"}, "sym": {"1", "5", "6"}, "none": set()}
    for v in probe.VARIANTS:
        ptx = probe.compile_ptx(v)
        ids = set(re.findall(r"bar(?:rier)?\.sync(?:\.aligned)?\s+(\d+)", ptx))
        assert ids == want[v], (v, ids)


def swapped_barrier_trace(kend_a: int, kend_b: int | None, swap_split: bool, kb: int = 64,
                          min_blocks: int = 4) -> dict:
    """Host model of the named-barrier syncs of one decode ATTENTION instruction on the swapped
    chain (attn_consume / attn_blocks; keys from 0): per consumer warpgroup the list of (where,
    barrier id) in program order, where = "q", a ring block j, "sums" or "merge". kend_b: a
    MODE_PAIR instruction's second unit (None: a lone unit, split over both warpgroups under
    SWAP_SPLIT when it has >= min_blocks blocks). A warpgroup's own barrier is 5 + wg (128
    threads), 3 the consumers' 256. The ring is ring_block's (A0 B0 A1 B1 .., then the longer
    unit's); a block's owner syncs twice in the softmax (swapped_softmax, or the idle stand-ins
    of a warpgroup without rows) and once more for a partial tail (v_tail_zero: its own barrier
    where each page is read by one warpgroup, else 3); under SWAP_SPLIT the warpgroup that
    does not own a block syncs the owner's syncs of it (attn_blocks's stand-ins, the tail test
    against the owner's key end)."""
    nblk = [-(-kend_a // kb), -(-kend_b // kb) if kend_b is not None else 0]
    paired = kend_b is not None
    split = swap_split and not paired and nblk[0] >= min_blocks
    if paired:
        walk = 2 * min(nblk) + (nblk[1] > nblk[0])
        ring = [(j & 1, j >> 1) if j < (walk & -2) else (walk & 1, j - (walk >> 1))
                for j in range(sum(nblk))]
    else:
        ring = [(0, j) for j in range(nblk[0])]
    kends = (kend_a, kend_b)
    trace = {}
    for wg in (0, 1):
        own = 5 + wg
        t = [("q", own)]                       # swap_load_q, or swap_idle_barriers(wg, 1)
        for j, (u, b) in enumerate(ring):
            mine = u == wg if paired else (j % 2 == wg if split else True)
            tail = kends[u] - b * kb < kb
            if mine:
                t += [(j, own)] * 2
                if tail:
                    t.append((j, own if paired or split else 3))
            elif swap_split:
                t += [(j, own)] * 2 + [(j, own)] * tail
        t += [("sums", own)] * 2               # swap_row_sums, or its stand-ins
        if split:
            t.append(("merge", 3))
        trace[wg] = t
    return trace


# (kend_a, kend_b): the pairrace step's pairs (2 / 14, 65 / 71, 131 / 201 keys), the longer unit
# first or second, odd and even block counts, whole blocks (no tail) against tails
SWAP_PAIRS = [(2, 14), (65, 71), (131, 201), (201, 131), (1, 833), (833, 1), (64, 65), (128, 129),
              (192, 64), (257, 63), (640, 641)]


def test_swap_split_pairs_and_split_units_sync_both_warpgroups_alike():
    """SWAP_SPLIT's barrier rule (session 31/32's racecheck signature on RMSNORM's partials: the
    two consumer warpgroups' own barriers 5 / 6 synced unequally often): with the switch every
    decode instruction of the swapped chain, a pair of unequal block counts as well as a split
    unit, has both warpgroups sync their own barrier at the same ring blocks and as often, and
    the 256-thread barrier 3 equally. The default build's pairs do not (the shorter unit's
    warpgroup syncs less: 10 against 12 for the pairrace step's 131 / 201 keys) and its lone
    units do."""
    def shape(t):                              # the trace with the warpgroup's own id as "wg"
        return [(w, "wg" if b in (5, 6) else b) for w, b in t]

    for pair in SWAP_PAIRS:
        tr = swapped_barrier_trace(*pair, swap_split=True)
        assert shape(tr[0]) == shape(tr[1]), (pair, tr)
    for kend in (1, 64, 65, 200, 256, 257, 300, 1000, 1025):
        for on in (False, True):
            tr = swapped_barrier_trace(kend, None, swap_split=on)
            assert shape(tr[0]) == shape(tr[1]), (kend, on, tr)
    # the split units (>= 4 blocks) merge through barrier 3 once; a pair never does
    assert swapped_barrier_trace(257, None, True)[0][-1] == ("merge", 3)
    assert all(b != 3 for p in SWAP_PAIRS for t in swapped_barrier_trace(*p, True).values()
               for _w, b in t)
    counts = {on: [len(t) for t in swapped_barrier_trace(131, 201, on).values()]
              for on in (False, True)}
    assert counts == {False: [10, 12], True: [19, 19]}, counts
