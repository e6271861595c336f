"""mk.trace's journal readings (CPU): the per-opcode breakdown the bench prints with --journal."""

from __future__ import annotations

import pytest
import torch

import mk.trace as tr
from mk.ir import Op


def _journal(rows):
    """rows: (sm, op, ticket, fetch, ready, end, roles dict) -> a 32-word journal + CTA table
    (roles: ROLE_WORDS names with times, or WAIT_WORDS names with durations)."""
    j = torch.zeros(len(rows), 32, dtype=torch.int64)
    for i, (sm, op, tk, tf, trd, te, roles) in enumerate(rows):
        j[i, :7] = torch.tensor([sm, sm, op, tf, trd, te, tk])
        for name, v in roles.items():
            j[i, {**tr.ROLE_WORDS, **tr.WAIT_WORDS}[name]] = v
    ctas = torch.tensor([[1000, 99000, 0], [1000, 99000, 1]])
    return j, ctas


def test_by_opcode_busy_phase_and_role_medians():
    norm, gemm = int(Op.RMSNORM), int(Op.GATE_UP)
    roles = dict(load0=2500, load1=3000, cons0=2600, cons1=5000, store0=2700)
    j, c = _journal([
        (0, norm, 0, 1000, 2000, 6000, roles),                      # layer 0
        (1, norm, 1, 1000, 3000, 5000, {}),                         # layer 0, no role times
        (0, gemm, 2, 6000, 7000, 17000, {k: v + 5000 for k, v in roles.items()}),
        (1, norm, 3, 20000, 21000, 23000, {}),                      # layer 1
    ])
    r = tr.by_opcode(j, c, 4, layer_of=[0, 0, 0, 1])
    n, g = r["ops"]["RMSNORM"], r["ops"]["GATE_UP"]
    assert (n["count"], g["count"]) == (3, 1)
    assert n["busy_us"] == pytest.approx((4000 + 2000 + 2000) / 1e3, abs=0.05)
    # per layer: layer 0 spans 2000 -> 6000, layer 1 21000 -> 23000
    assert n["phase_us"] == pytest.approx(6.0, abs=0.05)
    assert g["busy_share"] == pytest.approx(10000 / 18000, abs=1e-3)
    # own runs: CTA 0's GATE_UP was ready at 7000, after its RMSNORM's end (6000): all its own;
    # so are the RMSNORMs (CTA 1's second one was ready at 21000, its first ended at 5000)
    assert g["own_mean_us"] == pytest.approx(10.0)
    assert n["own_mean_us"] == pytest.approx(8 / 3, abs=0.01)
    # role spans from the one RMSNORM that has them: ready 2000 -> load0 2500 etc.
    assert n["load_late_us"] == pytest.approx(0.5) and n["load_us"] == pytest.approx(0.5)
    assert n["cons_us"] == pytest.approx(2.4) and n["store_tail_us"] == pytest.approx(1.0)
    assert g["cons_late_us"] == pytest.approx(0.6)       # ready 7000 -> cons0 7600
    text = tr.format_by_opcode(r)
    assert "load_late" in text and "GATE_UP" in text and "RMSNORM" in text


def test_own_run_starts_at_the_previous_end_on_its_cta():
    """An instruction ready before its CTA's previous one ended (early weight loads) owns the SM
    only from that end: own_mean_us counts from there, mean_us from ready."""
    gemm = int(Op.GATE_UP)
    j, c = _journal([(0, gemm, 0, 1000, 2000, 12000, {}),
                     (0, gemm, 1, 3000, 4000, 20000, {})])      # ready at 4000, SM free at 12000
    g = tr.by_opcode(j, c, 2)["ops"]["GATE_UP"]
    assert g["mean_us"] == pytest.approx((10000 + 16000) / 2 / 1e3)
    assert g["own_mean_us"] == pytest.approx((10000 + 8000) / 2 / 1e3)


def test_by_opcode_without_role_words():
    """8-word journals (older variants) still read: no role columns."""
    j, c = _journal([(0, int(Op.RMSNORM), 0, 1000, 2000, 3000, {})])
    r = tr.by_opcode(j[:, :8], c, 1)
    assert r["ops"]["RMSNORM"]["count"] == 1 and "load_us" not in r["ops"]["RMSNORM"]
    assert "load_late" not in tr.format_by_opcode(r)


def test_attention_page_waits_are_durations():
    """ATTENTION's page-wait words hold nanoseconds summed by the instruction's roles, not times:
    by_opcode reports their medians as they are (not minus the first entry) and the table shows
    their columns only when some opcode has them."""
    att = int(Op.ATTENTION)
    j, c = _journal([
        (0, att, 0, 1000, 2000, 50000, dict(load0=2100, ld_wait=3000, cons_wait=30000,
                                            st_wait=1000)),
        (1, att, 1, 1000, 2000, 52000, dict(load0=2100, ld_wait=5000, cons_wait=34000,
                                            st_wait=3000)),
        (2, att, 2, 1000, 2000, 51000, dict(load0=2100, ld_wait=4000, cons_wait=32000,
                                            st_wait=2000)),
    ])
    a = tr.by_opcode(j, c, 3)["ops"]["ATTENTION"]
    assert (a["ld_wait_us"], a["cons_wait_us"], a["st_wait_us"]) == (4.0, 32.0, 2.0)
    text = tr.format_by_opcode(tr.by_opcode(j, c, 3))
    assert "cons_wait" in text and "ld_wait" in text
    j2, c2 = _journal([(0, int(Op.RMSNORM), 0, 1000, 2000, 3000, dict(load0=2500))])
    assert "cons_wait" not in tr.format_by_opcode(tr.by_opcode(j2, c2, 1))


def test_role_words_match_the_megakernel():
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    assert tr.ROLE_WORDS == {"load0": M.J_LOAD0, "load1": M.J_LOAD1, "cons0": M.J_CONS0,
                             "cons1": M.J_CONS1, "store0": M.J_STORE0,
                             "cons1_wg1": M.J_CONS1_WG1, "store1": M.J_STORE1,
                             "store_kv": M.J_STORE_KV, "store_epi": M.J_STORE_EPI,
                             "store_p0": M.J_STORE_P0, "free_p0": M.J_FREE_P0, "epi1": M.J_EPI1,
                             "cons_epi0": M.J_CONS_EPI, "epi_ready": M.J_EPI_READY}
    assert tr.WAIT_WORDS == {"ld_wait": M.J_LOAD_WAIT, "cons_wait": M.J_CONS_WAIT,
                             "st_wait": M.J_STORE_WAIT, "mma_wait": M.J_MMA_WAIT,
                             "softmax": M.J_ATTN_SOFTMAX}
    assert not set(tr.WAIT_WORDS.values()) & set(tr.ROLE_WORDS.values())
    assert M.J_STORE_EPI > M.J_TICKET
    assert M.JOURNAL_WORDS > max(list(tr.ROLE_WORDS.values()) + list(tr.WAIT_WORDS.values()))


def _words(rows):
    """rows: (waits [(counter, target)], signal counter or None) -> an instruction word array."""
    from mk.ir import INSTR_WORDS, MAX_WAITS, NO_COUNTER, W_SIGNAL, W_SIGNAL_COUNT, W_WAIT0
    w = torch.zeros(len(rows), INSTR_WORDS, dtype=torch.int32)
    for i, (waits, signal) in enumerate(rows):
        for k in range(MAX_WAITS):
            c, t = waits[k] if k < len(waits) else (NO_COUNTER, 0)
            w[i, W_WAIT0 + 2 * k], w[i, W_WAIT0 + 2 * k + 1] = c, t
        w[i, W_SIGNAL] = NO_COUNTER if signal is None else signal
        w[i, W_SIGNAL_COUNT] = 1
    return w


def test_critical_path_follows_the_last_met_wait_then_the_sm():
    """A norm on SM 0 feeds two QKV tiles (SMs 0 and 1, counter 5 target 2); attention on SM 1
    waits for both (counter 6); a late reduce on SM 0 has no waits but was fetched after SM 0's
    QKV tile (a queue hop). The walk back from the last signal: reduce <- (queue) QKV on SM 0
    <- (dep) norm; the attention is not on the path. Runs and gaps add up to the path."""
    norm, qkv, attn, red = (int(o) for o in (Op.RMSNORM, Op.QKV_ROPE, Op.ATTENTION,
                                             Op.SPLITK_REDUCE))
    j, c = _journal([
        (0, norm, 0, 1000, 1000, 3000, {}),         # signals 5 (x2 below: count 2 via two norms)
        (1, norm, 1, 1000, 1200, 2500, {}),         # the other norm: signals 5 first
        (0, qkv, 2, 2900, 3400, 9000, {}),          # waits 5 >= 2: met by ticket 0 at 3000
        (1, qkv, 3, 2600, 3300, 8000, {}),
        (1, attn, 4, 8100, 9100, 12000, {}),        # waits 6 >= 2: met by ticket 2 at 9000
        (0, red, 5, 9050, 9100, 15100, {}),         # no waits; SM 0 was busy with ticket 2
    ])
    w = _words([([], 5), ([], 5), ([(5, 2)], 6), ([(5, 2)], 6), ([(6, 2)], None), ([], None)])
    r = tr.critical_path(j, c, 6, w)
    assert r["instructions"] == 3                   # reduce, QKV (ticket 2), norm (ticket 0)
    assert set(r["ops"]) == {"SPLITK_REDUCE", "QKV_ROPE", "RMSNORM"}
    assert r["ops"]["SPLITK_REDUCE"] == dict(count=1, run_us=6.0, dep_gap_us=0.0,
                                             queue_gap_us=0.1)     # 9100 - 9000 (ticket 2 end)
    assert r["ops"]["QKV_ROPE"] == dict(count=1, run_us=5.6, dep_gap_us=0.4, queue_gap_us=0.0)
    assert r["ops"]["RMSNORM"]["run_us"] == 2.0
    assert r["hops"]["QKV_ROPE -> SPLITK_REDUCE (queue)"]["count"] == 1
    assert r["hops"]["RMSNORM -> QKV_ROPE (dep)"]["gap_us"] == 0.4
    assert r["hops"]["entry -> RMSNORM (queue)"]["gap_us"] == 0.0
    # the path runs from the CTA's entry to the last signal: 15100 - 1000 ns
    assert r["path_us"] == r["span_us"] == 14.1
    text = tr.format_critical_path(r)
    assert "critical path 14.1 us" in text and "RMSNORM -> QKV_ROPE (dep)" in text
    # each opcode's share (run + the gaps before it): QKV_ROPE 5.6 + 0.4
    qkv_row = next(ln for ln in text.splitlines() if ln.strip().startswith("QKV_ROPE"))
    assert qkv_row.split()[-1] == "6.0" and "share" in text
    assert tr.critical_path(j[:0], c, 0, w) == {}


def test_critical_path_takes_the_sm_when_it_freed_last():
    """Waits met while the CTA's previous instruction still ran (early weight loads): the link is
    that instruction (a queue hop with a negative gap, the overlap), not the producer; the path's
    runs and gaps still add up to the span."""
    gemm, norm = int(Op.GATE_UP), int(Op.RMSNORM)
    j, c = _journal([
        (0, gemm, 0, 1000, 1000, 11000, {}),        # long GEMM on SM 0
        (1, norm, 1, 1000, 1000, 6000, {}),         # producer on SM 1, signals 3 at 6000
        (0, gemm, 2, 2000, 6100, 14000, {}),        # waits 3 >= 1: met at 6100, SM 0 busy to 11000
    ])
    w = _words([([], None), ([], 3), ([(3, 1)], None)])
    r = tr.critical_path(j, c, 3, w)
    assert r["instructions"] == 2 and set(r["ops"]) == {"GATE_UP"}
    assert r["hops"]["GATE_UP -> GATE_UP (queue)"]["gap_us"] == -4.9       # 6100 - 11000
    assert r["ops"]["GATE_UP"]["queue_gap_us"] == -4.9 and r["ops"]["GATE_UP"]["dep_gap_us"] == 0
    assert r["path_us"] == r["span_us"] == 13.0


@pytest.mark.parametrize("norm_end", [12000, 8000])
def test_critical_path_takes_a_late_norm_through_the_epilogue_wait(norm_end):
    """norm_fold=2: a GATE_UP tile waits for h's writer (DOWN) and, at its epilogue, for the
    row-scale norm (A_EPI_WAIT). A norm that signalled after the tile's consumers reached the
    epilogue (cons_epi0 = 9000) held the tile: the path runs through it (an epilogue hop, the
    tile's run counted from the norm's signal, held 3 us); one that signalled before is off the
    path. Either way the runs and gaps add up to the span."""
    from mk.instructions._common import A_EPI_TARGET, A_EPI_WAIT
    from mk.ir import W_OPCODE
    down, norm, gemm = int(Op.DOWN), int(Op.RMSNORM), int(Op.GATE_UP)
    j, c = _journal([
        (0, down, 0, 1000, 1000, 5000, {}),                     # writes h: signals 3
        (1, norm, 1, 1000, 5100, norm_end, {}),                 # row-scale norm: signals 4
        (0, gemm, 2, 2000, 5100, 13000, dict(cons_epi0=9000)),  # waits 3; epilogue waits 4
    ])
    w = _words([([], 3), ([(3, 1)], 4), ([(3, 1)], None)])
    for i, op in enumerate((down, norm, gemm)):
        w[i, W_OPCODE] = op
    w[2, A_EPI_WAIT], w[2, A_EPI_TARGET] = 4 + 1, 1
    r = tr.critical_path(j, c, 3, w)
    assert r["path_us"] == r["span_us"] == 12.0
    if norm_end > 9000:
        assert set(r["ops"]) == {"GATE_UP", "RMSNORM", "DOWN"}
        assert r["ops"]["GATE_UP"] == dict(count=1, run_us=1.0, dep_gap_us=0.0, queue_gap_us=0.0)
        hop = r["hops"]["RMSNORM -> GATE_UP (epi)"]
        assert hop["count"] == 1 and hop["gap_us"] == 0.0 and hop["held_us"] == 3.0
        assert r["ops"]["RMSNORM"]["run_us"] == 6.9
        assert "(held 3.0)" in tr.format_critical_path(r)
    else:
        assert set(r["ops"]) == {"GATE_UP", "DOWN"}
        assert r["ops"]["GATE_UP"]["run_us"] == 7.9
        assert r["hops"]["DOWN -> GATE_UP (dep)"]["gap_us"] == 0.1
        assert not any(k.endswith("(epi)") for k in r["hops"])


def _ktrace_journal(steps: int, ktrace: int, period: int, issue_lead: int, tma: int,
                    early: int = 0):
    """One GATE_UP tile's journal row with a K-step trace: the loader issues stage k at
    k * period - issue_lead (after waiting `period // 4` for pages), the loads land tma cycles
    later, the consumers want stage k at k * period and retire it one period after they got it;
    the first `early` stages carry no loader stamps (early weight loads)."""
    j = torch.zeros(1, tr.KT_BASE + tr.KT_WORDS * ktrace, dtype=torch.int64)
    j[0, :7] = torch.tensor([0, 0, int(Op.GATE_UP), 1000, 2000, 900000, 0])
    base = 10_000
    for k in range(min(steps, ktrace)):
        w = tr.KT_BASE + k * tr.KT_WORDS
        want = base + k * period
        issue = want - issue_lead
        full = max(want, issue + tma)
        if k >= early:
            j[0, w + tr.KT_L_START] = issue - period // 4
            j[0, w + tr.KT_L_ISSUE] = issue
        j[0, w + tr.KT_C_WAIT] = want
        j[0, w + tr.KT_C_FULL] = full
        j[0, w + tr.KT_C1_FULL] = full + 7
        j[0, w + tr.KT_C_RET] = full + period
    # the consumers' globaltimer stamps: at 2 cycles per ns
    last_ret = int(j[0, tr.KT_BASE + (min(steps, ktrace) - 1) * tr.KT_WORDS + tr.KT_C_RET])
    j[0, tr.ROLE_WORDS["cons0"]] = 500_000
    j[0, tr.ROLE_WORDS["cons_epi0"]] = 500_000 + (last_ret - base) // 2
    return j


def test_gemm_ktrace_loads_issued_in_time():
    j = _ktrace_journal(steps=24, ktrace=32, period=1000, issue_lead=3000, tma=1500)
    d = tr.gemm_ktrace(j, 1, 32)["GATE_UP"]
    assert d["tiles"] == 1 and d["steady_steps"] == 20 and d["traced_steps_p50"] == 24
    assert d["step"]["p50"] == 1000 and d["cons_wait"]["p50"] == 0 and d["waited_share"] == 0
    assert d["lead"]["p50"] == 3000 and d["loader"]["p50"] == 250 and d["flight"] is None
    # stages k .. k + 2 issued 3000 cycles ahead: stage k + 3's issue lands exactly at k's wait
    assert d["ahead"]["p50"] == 3
    assert d["wg_skew"]["p50"] == 7
    assert d["clock_ghz"] == pytest.approx(2.0, rel=1e-3)


def test_gemm_ktrace_late_loads_show_as_waits_and_flight():
    # issued 500 cycles ahead, landing 1500 after the issue: the consumers wait 1000 each step
    j = _ktrace_journal(steps=20, ktrace=16, period=1000, issue_lead=500, tma=1500, early=6)
    d = tr.gemm_ktrace(j, 1, 16)["GATE_UP"]
    assert d["traced_steps_p50"] == 16 and d["steady_steps"] == 12
    assert d["cons_wait"]["p50"] == 1000 and d["waited_share"] == 1.0
    assert d["flight"]["p50"] == 1500 and d["lead"]["p50"] == 500
    assert d["lead"]["n"] == 10                     # steps 4, 5 carry no loader stamps
    assert d["clock_ghz"] is None                   # the tile ran past the traced steps
    assert d["cons_wait_share"] == pytest.approx(1000 / 1000, abs=1e-3)
    assert "GATE_UP" in tr.format_gemm_ktrace(tr.gemm_ktrace(j, 1, 16))


def test_gemm_ktrace_needs_the_trace_words():
    j = _ktrace_journal(steps=8, ktrace=8, period=1000, issue_lead=2000, tma=500)
    assert tr.gemm_ktrace(j[:, :32], 1, 8) == {}
    assert tr.gemm_ktrace(j, 1, 0) == {}
    assert "no K-step trace" in tr.format_gemm_ktrace({})


def test_ktrace_words_match_the_gemm_bodies():
    pytest.importorskip("cutlass")
    from mk.instructions import _gemm_kernel as gk
    assert (tr.KT_BASE, tr.KT_WORDS) == (gk.KT_BASE, gk.KT_WORDS)
    assert (tr.KT_C_WAIT, tr.KT_C_FULL, tr.KT_C_RET, tr.KT_C1_FULL, tr.KT_L_START,
            tr.KT_L_ISSUE) == (gk.KT_C_WAIT, gk.KT_C_FULL, gk.KT_C_RET, gk.KT_C1_FULL,
                               gk.KT_L_START, gk.KT_L_ISSUE)
    import mk.megakernel as M
    assert M.JOURNAL_WORDS == gk.KT_BASE + gk.KT_WORDS * gk.KTRACE


def test_journal_readers_take_the_journals_own_words_of_a_ktrace_row():
    """A journal row with a K-step trace (hundreds of words) reads as the plain journal's:
    by_opcode / critical_path see the same instructions (events() converts only the first
    KT_BASE words: at B=1024 the whole rows as Python ints would take gigabytes)."""
    rows = [(0, int(Op.GATE_UP), 0, 1000, 2000, 9000, dict(cons0=2500, cons1=8000)),
            (1, int(Op.DOWN), 1, 1000, 9100, 15000, {})]
    j, c = _journal(rows)
    wide = torch.cat([j, torch.full((len(rows), 6 * 64), 123456789, dtype=torch.int64)], dim=1)
    assert tr.by_opcode(wide, c, 2) == tr.by_opcode(j, c, 2)
    assert tr.events(wide, c, 2) == tr.events(j, c, 2)


def _instr(op, row0=0, rows=0, args=None):
    """One instruction's words: opcode, token rows and argument words ({word index: value})."""
    from mk.ir import INSTR_WORDS, W_OPCODE, W_ROW0, W_ROWS
    w = [0] * INSTR_WORDS
    w[W_OPCODE], w[W_ROW0], w[W_ROWS] = int(op), row0, rows
    for i, v in (args or {}).items():
        w[i] = v
    return w


def test_variant_names_tell_sections_modes_and_row_kinds_apart():
    """QKV_ROPE by section, ATTENTION by mode, and, in a step of decode and prompt tokens, each
    token-row instruction by the kind of its rows; LM_HEAD's rows are sequences (untouched)."""
    from mk.instructions import attention as at
    from mk.instructions import qkv as qk
    sec, mode = qk.A_SECTION, at.A_MODE
    instrs = torch.tensor([
        _instr(Op.QKV_ROPE, 0, 128, {sec: qk.SEC_Q}),           # rows 0..127: 4 decode + prompt
        _instr(Op.QKV_ROPE, 4, 124, {sec: qk.SEC_K}),           # prompt rows only
        _instr(Op.QKV_ROPE, 0, 4, {sec: qk.SEC_V}),             # decode rows only
        _instr(Op.ATTENTION, 0, 1, {mode: at.MODE_PAIR}),
        _instr(Op.ATTENTION, 4, 16, {mode: at.MODE_DIRECT}),
        _instr(Op.GATE_UP, 0, 128),
        _instr(Op.LM_HEAD, 0, 2),
    ])
    prompt = [False] * 4 + [True] * 124
    assert tr.variant_names(instrs, prompt) == [
        "QKV_ROPE.q/both", "QKV_ROPE.k/prompt", "QKV_ROPE.v/decode", "ATTENTION.pair/decode",
        "ATTENTION.direct/prompt", "GATE_UP/both", "LM_HEAD"]
    # a step of one kind of token: no row suffix
    assert tr.variant_names(instrs, [False] * 128)[:3] == ["QKV_ROPE.q", "QKV_ROPE.k",
                                                           "QKV_ROPE.v"]
    assert tr.variant_names(instrs)[5] == "GATE_UP"


def test_by_opcode_rows_by_given_names():
    """name_of splits one opcode's instructions into rows of their own; the table's name column
    widens to the longest name."""
    gemm = int(Op.QKV_ROPE)
    roles = dict(cons0=2000, cons_epi0=5000, cons1=6000)
    late = {k: v + 10000 for k, v in roles.items()}
    late["cons1"] = 20000                                       # a 5 us epilogue
    j, c = _journal([(0, gemm, 0, 1000, 1500, 7000, roles),
                     (1, gemm, 1, 11000, 11500, 21000, late)])
    names = ["QKV_ROPE.q/decode", "QKV_ROPE.q/prompt"]
    r = tr.by_opcode(j, c, 2, name_of=names)
    assert set(r["ops"]) == set(names)
    assert r["ops"]["QKV_ROPE.q/decode"]["cons_epi_us"] == pytest.approx(1.0)
    assert r["ops"]["QKV_ROPE.q/prompt"]["cons_epi_us"] == pytest.approx(5.0)
    header = tr.format_by_opcode(r).splitlines()[1]
    assert header.startswith("opcode" + " " * (len(names[1]) + 1 - len("opcode")) + "  count")
