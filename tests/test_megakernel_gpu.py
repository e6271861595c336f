"""GPU suite of the megakernel core (H100/H200): `pytest -m gpu tests/test_megakernel_gpu.py`,
or scripts/gpu_tests.sh on the device machine. Skips cleanly without a Hopper GPU or CuTe DSL."""

from __future__ import annotations

import os
import re
import types

import pytest
import torch

from mk.instructions.base import Buf

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
# Marked, not skipped at import: `pytest -m 'not gpu'` deselects these instead of counting skips.
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")]

if HOPPER:  # on a Hopper machine a missing CuTe DSL is an error, not a skip
    import mk.megakernel as M

T, H, L = 256, 2048, 4
NBUF = 3


def _weights(H=H, L=L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return types.SimpleNamespace(
        attn_norm=(1 + 0.1 * torch.randn(L, H, generator=g)).bfloat16(),
        mlp_norm=(1 + 0.1 * torch.randn(L, H, generator=g)).bfloat16(),
        final_norm=(1 + 0.1 * torch.randn(H, generator=g)).bfloat16(),
        config=types.SimpleNamespace(rms_norm_eps=1e-5))


def _arena(T=T, H=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(NBUF, T, H, generator=g).bfloat16()


_MK = {}


def _mk(T=T, H=H, journal=False, timeout_s=2.0, handoff=None, backoff_ns=None):
    key = (T, H, journal, timeout_s, handoff, backoff_ns)
    if key not in _MK:
        w = _weights(H)
        arena = torch.zeros(NBUF, T, H, dtype=torch.bfloat16, device="cuda")
        _MK[key] = (M.Megakernel(arena, M.norm_table(w).cuda(), L, 1e-5, journal=journal,
                                 timeout_s=timeout_s, handoff=handoff or M.DEFAULT_HANDOFF,
                                 backoff_ns=backoff_ns or M.DEFAULT_BACKOFF_NS), w)
    return _MK[key]


def _ulp_diff(a, b):
    """Max distance in bf16 ulps (a and b bf16, same shape), NaN-free inputs."""
    ai = a.view(torch.int16).int()
    bi = b.view(torch.int16).int()
    ai = torch.where(ai < 0, -(ai & 0x7FFF), ai)
    bi = torch.where(bi < 0, -(bi & 0x7FFF), bi)
    return int((ai - bi).abs().max())


def run_and_compare(stream, n_ctr, T=T, H=H, exact=None, seed=0):
    mk, w = _mk(T, H)
    x0 = _arena(T, H, seed)
    mk.arena.copy_(x0)
    mk.run(stream)
    got = mk.arena.cpu()
    want = M.rows_oracle(stream, x0, w)
    has_norm = bool((stream[:, 0] == int(M.Op.RMSNORM)).any())
    if exact or (exact is None and not has_norm):
        assert torch.equal(got, want), f"mismatch: {(got != want).sum().item()} elements"
    else:
        # RMSNORM's fp32 statistic is summed in another order than torch: allow rounding noise
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    return got, want


def test_empty_and_noops():
    s, n = M.plan_noops(0)
    run_and_compare(s, n)
    s, n = M.plan_noops(5000, signal=True)
    run_and_compare(s, n)


@pytest.mark.parametrize("H_", [256, 1000 - 1000 % 8, 2048, 8192])
def test_single_ops_match_torch(H_):
    from mk.ir import serialize
    from mk.instructions.rows import rows_instruction
    from mk.ir import Op
    ins = [rows_instruction(Op.COPY, Buf.HIDDEN, Buf.SCRATCH, 0, 13, 8, H_ - 16, signal=0),
           rows_instruction(Op.RESIDUAL_ADD, Buf.SCRATCH, Buf.NORMED, 16, 21, 0, H_, signal=1),
           rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.SCRATCH, 40, 27, 0, H_, layer=2, signal=2)]
    s = serialize(ins)
    got, want = run_and_compare(s, 3, T=T, H=H_, exact=False)
    # COPY and RESIDUAL_ADD regions must be bit-exact, the norm within one bf16 ulp
    assert torch.equal(got[2, 0:13], want[2, 0:13])
    assert torch.equal(got[1, 16:37], want[1, 16:37])
    assert _ulp_diff(got[2, 40:67], want[2, 40:67]) <= 1
    # nothing outside the tiles was touched
    x0 = _arena(T, H_)
    assert torch.equal(got[0], x0[0])
    assert torch.equal(got[2, 67:], x0[2, 67:])


def test_long_cross_sm_chains_exact():
    s, n = M.plan_chain(600, T, H, rows=8, ops=("copy", "add", "noop"), chains=8)
    run_and_compare(s, n, exact=True)


def test_long_chain_with_norms():
    s, n = M.plan_chain(300, T, H, rows=16, ops=("norm", "copy", "add"), chains=4)
    run_and_compare(s, n)


@pytest.mark.parametrize("seed", range(6))
def test_random_topological_orders(seed):
    s, n = M.plan_layers(T, H, L, seed=seed, noops=20)
    try:
        from mk import verify
        verify.verify(s, n)
    except ImportError:
        pass
    run_and_compare(s, n, seed=seed)


@pytest.mark.parametrize("seed", range(3))
def test_random_orders_exact_without_norm(seed):
    s, n = M.plan_layers(T, H, L, seed=100 + seed, with_norm=False, noops=10)
    run_and_compare(s, n, exact=True, seed=seed)


@pytest.mark.parametrize("k", range(1, 9))
def test_page_pool_cycles(k):
    s, n = M.plan_page_cycle(k, 1024, 1024, seed=k)
    run_and_compare(s, n, T=1024, H=1024)


def test_repeated_launches_bitwise_identical():
    s, n = M.plan_layers(T, H, L, seed=7, noops=20)
    mk, w = _mk()
    x0 = _arena(seed=7).cuda()
    prep = mk.prepare(s)
    first = None
    for i in range(100):
        mk.arena.copy_(x0)
        mk.launch(prep, check=(i % 10 == 9))
        if first is None:
            first = mk.arena.clone()
        else:
            assert torch.equal(mk.arena, first), f"launch {i} differs"
    mk.check()
    assert int(mk.counters.abs().sum()) == 0, "counters not reset by the kernel"


def test_unsatisfiable_wait_raises():
    from mk.ir import serialize
    from mk.instructions.rows import rows_instruction
    from mk.ir import Op
    mk, _ = _mk(timeout_s=0.25)
    ins = [rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, signal=0) for _ in range(40)]
    ins.append(rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, waits=[(5, 3)], signal=6))
    ins += [rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, waits=[(6, 1)], signal=7) for _ in range(10)]
    import time
    t0 = time.time()
    with pytest.raises(M.MegakernelError) as ei:
        mk.run(serialize(ins))
    dt = time.time() - t0
    e = ei.value
    # the first wait to time out is named: #40 itself or one of its dependents #41..#50
    assert (e.instr, e.counter, e.target, e.value) == (40, 5, 3, 0) or \
        (41 <= e.instr <= 50 and (e.counter, e.target, e.value) == (6, 1, 0)), str(e)
    print("raised:", e)
    assert 0 <= e.sm < 1000
    assert dt < 5.0, f"took {dt:.1f}s"
    # the machine recovers: the next plan runs
    s, n = M.plan_noops(100, signal=True)
    mk.run(s)


def test_recorded_launches_finish_apart():
    """Launches queued back to back with record=True (the engine's run-ahead steps) finish one
    at a time, each its own result and state; a failed launch with another queued behind it
    raises at its own finish_launch, naming its instruction, within seconds; more unfinished
    records than LAUNCH_RECORDS (before launching) and a second finish are refused."""
    import time

    from mk.instructions.rows import rows_instruction
    from mk.ir import Op, serialize
    s, n = M.plan_layers(T, H, L, seed=3, noops=5)
    mk, w = _mk(timeout_s=0.25)
    x0 = _arena(seed=3)
    want = M.rows_oracle(s, x0, w)
    prep = mk.prepare(s)
    mk.arena.copy_(x0.cuda())
    first = mk.launch(prep, check=False, record=True)
    snap = mk.arena.clone()                     # queued between the two launches
    mk.arena.copy_(x0.cuda())
    second = mk.launch(prep, check=False, record=True)
    mk.finish_launch(first)
    mk.finish_launch(second)
    torch.testing.assert_close(snap.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(snap, mk.arena)
    with pytest.raises(RuntimeError, match="finished already"):
        mk.finish_launch(second)
    recs = [mk.launch(prep, check=False, record=True) for _ in range(M.LAUNCH_RECORDS)]
    with pytest.raises(RuntimeError, match="recorded launches in flight"):
        mk.launch(prep, check=False, record=True)           # refused before it launches
    for r in recs:
        mk.finish_launch(r)
    mk.finish_launch(mk.launch(prep, check=False, record=True))
    # a launch that times out, another queued behind it
    ins = [rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, signal=0) for _ in range(8)]
    ins.append(rows_instruction(Op.NOOP, 0, 0, 0, 0, 0, 0, waits=[(5, 3)], signal=6))
    bad = mk.prepare(serialize(ins))
    t0 = time.time()
    failed = mk.launch(bad, check=False, record=True)
    behind = mk.launch(prep, check=False, record=True)
    with pytest.raises(M.MegakernelError) as ei:
        mk.finish_launch(failed)
    assert (ei.value.instr, ei.value.counter, ei.value.target) == (8, 5, 3), str(ei.value)
    try:
        mk.finish_launch(behind)            # it ran after the failure: it may report it too
    except M.MegakernelError:
        mk.reset()
    assert time.time() - t0 < 5.0
    mk.arena.copy_(x0.cuda())
    mk.run(s)                               # the machine recovers
    assert torch.equal(mk.arena, snap)


def test_journal_trace(tmp_path):
    import mk.trace as tr
    mk, w = _mk(journal=True)
    s, n = M.plan_layers(T, H, L, seed=3, noops=10)
    mk.arena.copy_(_arena(seed=3))
    mk.run(s)
    j, c = mk.journal_rows(s.shape[0])
    assert (j[:, M.J_END] >= j[:, M.J_READY]).all() and (j[:, M.J_READY] >= j[:, M.J_FETCH]).all()
    assert sorted(j[:, M.J_TICKET].tolist()) == list(range(s.shape[0]))
    trace = tr.write_chrome_trace(str(tmp_path / "t.json"), j, c, s.shape[0])
    assert len(trace["traceEvents"]) > s.shape[0]
    tr.draw_timeline(str(tmp_path / "t.png"), j, c, s.shape[0])
    assert (tmp_path / "t.png").stat().st_size > 100
    out = os.environ.get("MK_TRACE_OUT")
    if out:
        import shutil
        shutil.copy(tmp_path / "t.json", os.path.join(out, "megakernel_trace.json"))
        shutil.copy(tmp_path / "t.png", os.path.join(out, "megakernel_timeline.png"))


def test_selftest_test_mode_passes(capsys):
    """`python -m mk.megakernel selftest`: rows-only plans with the tiny model's norm weights, on
    the GPU through mk.megakernel.RowsStreamRunner, equal to the torch faces."""
    import json
    rc = M.selftest(["--json", "--tokens", "128"])
    out = capsys.readouterr()
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert rc == 0 and summary["passed"], out.err
    assert all(p["ok"] for p in summary["plans"]) and len(summary["plans"]) == 3


@pytest.mark.parametrize("handoff,backoff_ns", [("warp", None), ("group", None), (None, 50)])
def test_handoff_variants_bitwise_equal(handoff, backoff_ns):
    """Every compile variant (hand-off mode, backoff cap) gives the default's bytes: same op order."""
    ref, _ = _mk()
    var, _ = _mk(handoff=handoff, backoff_ns=backoff_ns)
    for s, n in (M.plan_layers(T, H, L, seed=11, noops=20),
                 M.plan_chain(120, T, H, rows=8, ops=("norm", "copy", "add"), chains=4)):
        outs = []
        for m in (ref, var):
            m.arena.copy_(_arena(T, H, seed=11))
            m.run(s)
            outs.append(m.arena.clone())
        assert torch.equal(outs[0], outs[1])


# A plan of 4 RMSNORMs whose loader never hands ticket 3's page over (MK_TEST_STARVE_TICKET=3,
# compile-time): the process's first lines for the starved-wait tests (`mk`, built with
# Megakernel's keywords `mk_kwargs`, and `ins`, the plan's instructions).
_STARVED_PLAN = '''if True:
    import faulthandler, json, os, sys, time, types
    faulthandler.dump_traceback_later({stall_s}, exit=True)  # a stall shows where, then ends
    import torch
    sys.path.insert(0, {root!r})
    import mk.megakernel as M
    from mk.instructions import _rows_kernel as rk
    from mk.instructions.base import Buf
    from mk.instructions.rows import rows_instruction
    from mk.ir import Op, serialize
    assert rk.STARVE_TICKET == 3
    T, H, L = 64, 256, 2
    w = types.SimpleNamespace(attn_norm=torch.ones(L, H).bfloat16(),
                              mlp_norm=torch.ones(L, H).bfloat16(),
                              final_norm=torch.ones(H).bfloat16())
    arena = torch.randn(3, T, H, device="cuda").bfloat16()
    mk = M.Megakernel(arena, M.norm_table(w).cuda(), L, 1e-5, {mk_kwargs})
    ins = [rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.SCRATCH, 8 * i, 8, 0, H, signal=i)
           for i in range(4)]
'''


def _run_starved_plan(body: str, mk_kwargs: str, env: dict, *argv, stall_s: int = 420) -> dict:
    """_STARVED_PLAN then `body` (indented 4, printing one JSON line last) in a process of its
    own with os.environ updated by env: that JSON. The process is killed once it has printed
    the line (a hung kernel may hold its exit) or after stall_s (its Python stacks then show
    where it stood)."""
    import json
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = _STARVED_PLAN.format(root=root, mk_kwargs=mk_kwargs, stall_s=stall_s) + body
    p = subprocess.Popen([sys.executable, "-c", code, *argv], env=dict(os.environ, **env),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in p.stdout:                # ends at the child's exit (faulthandler's at most)
            lines.append(line)
            if line.startswith("{"):
                break
    finally:
        p.kill()
        p.wait(timeout=60)
    assert lines and lines[-1].startswith("{"), "".join(lines)[-3000:]
    out = json.loads(lines[-1])
    print(out)
    return out


def test_a_hang_is_reported_not_waited_on(monkeypatch):
    """A launch that never ends (MK_WAIT_SLIM=1, a probe whose waits have no bound, with the
    loader starving ticket 3's page) raises MegakernelHang from a checked run after hang_s, with
    the state words, instead of blocking the caller for ever (in a process of its own: the GPU
    context is lost after it)."""
    monkeypatch.delenv("MK_WAIT_WATCHDOG", raising=False)
    out = _run_starved_plan('''
    assert rk.WAIT_SLIM and not rk.WATCHDOG
    mk.run(serialize(ins[:2]))           # compiled (and ticket 3 absent) before the clock
    t0 = time.time()
    try:
        mk.run(serialize(ins))
        out = dict(raised=None)
    except M.MegakernelHang as e:
        out = dict(raised="hang", text=str(e))
    out["seconds"] = time.time() - t0
    print(json.dumps(out), flush=True)
    time.sleep(600)                      # the kernel still runs: the parent kills this process
''', "timeout_s=0.25, hang_s=5", dict(MK_TEST_STARVE_TICKET="3", MK_WAIT_SLIM="1"),
                            stall_s=240)
    assert out["raised"] == "hang" and "still running after 5 s" in out["text"], out
    assert re.search(r"\b\d+ of \d+ CTAs ended, queue head \d+", out["text"]), out
    assert 5 <= out["seconds"] < 30, out


@pytest.mark.parametrize("compact", ["0", "1", "watchdog"])
def test_starved_page_wait_names_its_instruction(compact):
    """An mbarrier wait's bound holds and its record names the starved instruction, with
    write_error's record and with MK_WAIT_COMPACT's one-CAS record: the starved plan (ticket 3's
    page never handed over) raises MegakernelError within seconds, a page-full (consumers) or
    page-done (storer) wait of instruction 3 on a real SM and CTA; the next plan runs. Under
    MK_WAIT_WATCHDOG=1 the role waits have no bound: the controller's wait for ticket 3's slot
    after END (the last instruction: no refill of its slot) names it, a stalled instruction."""
    out = _run_starved_plan('''
    assert rk.WAIT_COMPACT == (sys.argv[1] != "0")
    assert rk.WATCHDOG == (sys.argv[1] == "watchdog")
    t0 = time.time()
    try:
        mk.run(serialize(ins))
        out = dict(raised=False)
    except M.MegakernelError as e:
        out = dict(raised=True, kind=M.MegakernelError.KINDS.get(e.kind, e.kind),
                   instr=e.instr, sm=e.sm, cta=e.cta, grid=mk.grid, text=str(e))
    out["seconds"] = time.time() - t0
    s, n = M.plan_noops(100, signal=True)
    mk.run(s)
    out["recovered"] = True
    print(json.dumps(out))
''', "timeout_s=0.25", dict(MK_TEST_STARVE_TICKET="3",
                              MK_WAIT_COMPACT="0" if compact == "0" else "1",
                              MK_WAIT_WATCHDOG="1" if compact == "watchdog" else "0"), compact)
    assert out["raised"], out
    kinds = (("stalled instruction (its roles past the bound)",) if compact == "watchdog" else
             ("page-full wait", "page-done wait"))
    assert out["kind"] in kinds and out["instr"] == 3, out
    assert 0 <= out["sm"] < 1000 and 0 <= out["cta"] < out["grid"], out
    assert out["seconds"] < 10 and out["recovered"], out
