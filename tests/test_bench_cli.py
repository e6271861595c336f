"""launch/bench.py: a tiny CPU run end to end (as a user runs it) and clear refusals of bad arguments."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "launch" / "bench.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("mk_launch_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod           # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _load_bench()


def test_tiny_cpu_run_writes_json_table_and_png(tmp_path, bench, capsys):
    out = tmp_path / "e2e.json"
    env = dict(os.environ, MK_NO_PROGRESS="1")
    env.pop("PYTHONPATH", None)
    p = subprocess.run([sys.executable, str(BENCH), "--shape", "tiny", "--device", "cpu",
                        "--batch", "1,4", "--context", "64", "--mixed", "2:32:8", "--reps", "3",
                        "--warmup", "1", "--json", "--out", str(out)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.loads(p.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == json.loads(json.dumps(rep))
    for key in ("date", "git_commit", "device", "command", "shape", "measured", "checks", "notes",
                "systems", "points", "complete"):
        assert key in rep, key
    assert rep["complete"] is True and rep["device_type"] == "cpu"
    assert "--shape tiny" in rep["command"]
    assert rep["systems"] == ["megakernel", "eager", "graph", "compile"]
    assert rep["shape"]["name"] == "tiny" and rep["shape"]["layers"] == 4
    m = rep["measured"]
    assert m["copy_bandwidth_Bps"] > 1e8 and m["matmul_flops_per_s"] > 1e7
    # the correctness guard ran and passed: float32 is exact to rounding, bf16 within tolerance
    checks = rep["checks"]
    assert checks["peer"]["ok"] is True
    assert checks["peer_vs_reference_float32"]["decode_rel_err"] < 1e-4
    assert checks["peer_vs_reference_bfloat16"]["mixed_rel_err"] < 2e-2
    assert any("NOT simulated" in n for n in rep["notes"])

    kinds = [(pt["kind"], pt["batch"], pt["context"], pt["prefill"]) for pt in rep["points"]]
    assert kinds == [("decode", 1, 64, 0), ("decode", 4, 64, 0), ("mixed", 2, 32, 8)]
    for pt in rep["points"]:
        fl = pt["floor"]
        assert fl["ms"] > 0 and fl["bytes"] > 0 and fl["flops"] > 0
        assert fl["ms"] == pytest.approx(max(fl["bytes_ms"], fl["flops_ms"]))
        assert fl["bytes"] == sum(fl["bytes_detail"].values())
        eager = pt["results"]["eager"]
        assert eager["status"] == "ok" and eager["reps"] == 3
        assert 0 < eager["min_ms"] <= eager["ms"] < 10_000 and math.isfinite(eager["ms"])
        assert eager["tokens_per_s"] == pytest.approx(pt["tokens"] / (eager["ms"] / 1e3))
        assert eager["over_floor"] == pytest.approx(eager["ms"] / fl["ms"])
        # a floor far above the step would be wrong; on a loaded 2-core CPU the measured copy
        # and matmul rates (the floor's divisors) swing by a few times: 0.197 seen (session 61)
        assert eager["over_floor"] > 0.05
        # no GPU: the megakernel column is n/a with the backend's reason; graph/compile skipped
        mk = pt["results"]["megakernel"]
        assert mk["status"] == "n/a" and "GPU" in mk["error"]
        for s in ("graph", "compile"):
            assert pt["results"][s]["status"] == "skipped"
        assert pt["strongest_peer"] == "eager" and pt["megakernel_over_strongest_peer"] is None
    assert rep["points"][2]["tokens"] == 10

    # the table comes last on stderr (stdout's last line is the JSON with --json)
    assert "mk/best peer" in p.stderr and "n/a" in p.stderr and "floor = max(" in p.stderr
    assert "Traceback" not in p.stderr
    if importlib.util.find_spec("matplotlib") is not None:
        assert Path(rep["png"]).is_file() and Path(rep["png"]).stat().st_size > 1000

    # --merge: points of two runs (a run split for a time limit) in one report, no timing
    other = json.loads(out.read_text())
    other["points"] = [dict(pt, batch=8, label="decode B=8 ctx=64") for pt in other["points"][:1]]
    (tmp_path / "b.json").write_text(json.dumps(other))
    rc = bench.main(["--merge", str(out), str(tmp_path / "b.json"), "--out",
                     str(tmp_path / "m.json"), "--no-png"])
    assert rc == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert [(pt["kind"], pt["batch"]) for pt in merged["points"]] == \
        [("decode", 1), ("decode", 4), ("decode", 8), ("mixed", 2)]
    assert len(merged["merged_from"]) == 2
    assert "mk/best peer" in capsys.readouterr().out
    # merging a merged report again: its runs listed once each, one "merged from" note
    rc = bench.main(["--merge", str(tmp_path / "m.json"), str(tmp_path / "b.json"), "--out",
                     str(tmp_path / "m2.json"), "--no-png"])
    assert rc == 0
    again = json.loads((tmp_path / "m2.json").read_text())
    assert [src["path"] for src in again["merged_from"]] == [str(out), str(tmp_path / "b.json"),
                                                             str(tmp_path / "b.json")]
    assert [n for n in again["notes"] if n.startswith("merged from")] == \
        ["merged from 3 runs (each point keeps the floor measured in its run)"]


@pytest.mark.parametrize("args, message", [
    (["--batch", "1,8192"], "--batch 8192: a step holds 1 to 4096"),
    (["--batch", "0"], "--batch 0"),
    (["--batch", "1,x"], "expected comma-separated integers"),
    (["--batch", "16", "--context", "4096", "--memory-gb", "0.05"], "the KV cache needs"),
    (["--systems", "eager,warp"], "unknown system(s) warp"),
    (["--batch", "1,4,16", "--context", "64,64"], "one value or one per batch"),
    (["--mixed", "1:2"], "expected DECODE:CONTEXT:PREFILL"),
    (["--mixed", "4000:64:200"], "over the 4096 tokens"),
    (["--context", "99999"], "max_position_embeddings"),
    (["--layers", "9"], "the model has 4 layers"),
    (["--model", "/nonexistent/ckpt"], "not a directory"),
    (["--tp", "3"], "TP size 3 does not divide"),
    (["--plan", "kv_split=128,bogus=1"], "--plan: 'bogus=1' is not FIELD=VALUE"),
    (["--plan", "norm_rows=x"], "--plan: norm_rows='x' is not an integer"),
    (["--plan", "norm_rows=0"], "--plan: PlanConfig.norm_rows must be a positive integer"),
    (["--plan", "policy=random"], "--plan: unknown queue policy 'random'"),
    (["--plan", "split_k=2"], "--plan: 'split_k=2' is not FIELD=VALUE"),
    (["--plan-ab", "cr"], "--plan-ab: 'cr' is not NAME:FIELD=VALUE,..."),
    (["--plan-ab", "cr:bogus=1"], "--plan-ab cr: 'bogus=1' is not FIELD=VALUE"),
    (["--plan-ab", "a:attn_lpt=2 a:attn_lpt=0"], "--plan-ab: the name 'a' is taken"),
    (["--plan-ab", "base:attn_lpt=2"], "--plan-ab: the name 'base' is taken"),
    (["--plan-ab", "l2:attn_lpt=2", "--systems", "eager"], "--plan-ab: times the megakernel's"),
    (["--batch", "none", "--mixed", "none"], "--batch none with --mixed none: no point to run"),
    (["--batch", "1,x"], "--batch '1,x': expected comma-separated integers"),
    (["--rep-gap-ms", "-1"], "--rep-gap-ms must be in [0, 60000], got -1"),
    (["--journal-isolated", "GATE_UP"], "--journal-isolated: runs with --journal only"),
    (["--journal", "--journal-isolated", "GATE_UP,GATEUP"],
     "--journal-isolated: unknown opcode(s) GATEUP"),
    (["--isolated-builds", "lean"], "--isolated-builds: runs with --journal-isolated only"),
    (["--profile-isolated", "full:GATE_UP"], "--profile-isolated: runs with --journal-isolated only"),
    (["--journal", "--journal-isolated", "GATE_UP,QKV_ROPE", "--isolated-builds", "lean"],
     "--isolated-builds: GEMM opcodes without step metadata only"),
    (["--journal", "--journal-isolated", "GATE_UP", "--isolated-builds", "lean,tiny"],
     "--isolated-builds: unknown build(s) tiny; choose from lean, gemms, families"),
    (["--journal", "--journal-isolated", "GATE_UP", "--isolated-builds", "lean",
      "--profile-isolated", "gemms:GATE_UP"], "--profile-isolated: 'gemms:GATE_UP' is not BUILD:OP"),
    (["--journal", "--journal-isolated", "GATE_UP", "--profile-isolated", "full:DOWN"],
     "--profile-isolated: 'full:DOWN' is not BUILD:OP"),
])
def test_bad_args_fail_clearly(bench, capsys, args, message):
    rc = bench.main(["--shape", "tiny", "--device", "cpu", "--out", os.devnull, *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err and err.startswith("error: "), err
    assert "Traceback" not in err


def test_memory_refusal_names_the_sizes(bench, capsys):
    rc = bench.main(["--shape", "70b-tp8", "--device", "cpu", "--batch", "4096", "--context", "1024",
                     "--memory-gb", "139", "--mixed", "none"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "171.80 GB" in err and "lower --context or --batch" in err


def test_unknown_shape_is_an_argparse_error(bench, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--shape", "nope"])
    assert e.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_floor_counts_the_70b_rank_like_design_md(bench):
    """The byte / flop counts reproduce the floors DESIGN.md quotes at 4.2 TB/s and 751 TF/s."""
    from mk.config import ParallelConfig
    cfg, tp = bench.SHAPES["70b-tp8"]
    par = ParallelConfig(tp, 0)
    want = {1: 4.1, 64: 4.8, 256: 6.7, 1024: 24.2, 4096: 95}
    for b, ms in want.items():
        pt = bench.Point("decode", b, bench.default_context(b))
        fl = bench.floor_of(bench.step_cost(cfg, par, pt), 4.2e12, 751e12)
        assert fl["ms"] == pytest.approx(ms, rel=0.05), (b, fl)
    assert bench.weight_bytes(cfg, par) / 1e9 == pytest.approx(17.6, abs=0.1)


def test_experiment_switches_are_named(bench, monkeypatch):
    """A leave-one-out build (MK_ATTN_EXPERIMENT / MK_GEMM_EXPERIMENT set) is timed with a note
    instead of refused: experiment_switches names exactly the switches that are set."""
    monkeypatch.delenv("MK_ATTN_EXPERIMENT", raising=False)
    monkeypatch.delenv("MK_GEMM_EXPERIMENT", raising=False)
    assert bench.experiment_switches() == {}
    monkeypatch.setenv("MK_ATTN_EXPERIMENT", "nomath")
    monkeypatch.setenv("MK_GEMM_EXPERIMENT", "")
    assert bench.experiment_switches() == {"MK_ATTN_EXPERIMENT": "nomath"}


def test_isolated_subplan_takes_one_layers_tiles_ready_and_silent(bench):
    """--journal-isolated's sub-plan: the opcode's instructions of the layer, waits and signals
    cleared (ready at once, touching no counter of the step), other words as planned."""
    import torch

    from mk.instructions._common import A_EPI_TARGET, A_EPI_WAIT
    from mk.ir import (INSTR_WORDS, MAX_WAITS, NO_COUNTER, W_LAYER, W_OPCODE, W_ROW0, W_SIGNAL,
                       W_WAIT0, Op)
    rows = []
    for layer in range(3):
        for op in (Op.RMSNORM, Op.GATE_UP, Op.GATE_UP, Op.DOWN):
            w = torch.zeros(INSTR_WORDS, dtype=torch.int32)
            w[W_OPCODE], w[W_LAYER], w[W_ROW0] = int(op), layer, len(rows)
            w[W_WAIT0], w[W_WAIT0 + 1], w[W_SIGNAL] = 7 + layer, 3, 9 + layer
            if op == Op.GATE_UP:            # norm_fold=2: the epilogue waits for the norm's rows
                w[A_EPI_WAIT], w[A_EPI_TARGET] = 9 + layer + 1, 2
            elif op == Op.DOWN:             # the same word is another argument of DOWN's
                w[A_EPI_WAIT] = 42
            rows.append(w)
    instrs = torch.stack(rows)
    sub = bench.isolated_subplan(instrs, "GATE_UP", 1)
    assert sub.shape == (2, INSTR_WORDS)
    assert (sub[:, W_OPCODE] == int(Op.GATE_UP)).all() and (sub[:, W_LAYER] == 1).all()
    assert sub[:, W_ROW0].tolist() == [5, 6]
    for k in range(MAX_WAITS):
        assert (sub[:, W_WAIT0 + 2 * k] == NO_COUNTER).all()
    assert (sub[:, W_SIGNAL] == NO_COUNTER).all()
    assert (sub[:, A_EPI_WAIT] == 0).all() and (sub[:, A_EPI_TARGET] == 0).all()
    assert instrs[5, W_SIGNAL] == 10                  # the step's stream is left as it was
    assert instrs[5, A_EPI_WAIT] == 11
    down = bench.isolated_subplan(instrs, "DOWN", 1)  # other opcodes' words there are theirs
    assert (down[:, A_EPI_WAIT] == 42).all()
    assert bench.isolated_subplan(instrs, "QKV_ROPE", 1) is None
    with pytest.raises(SystemExit, match="unknown opcode"):
        bench.isolated_subplan(instrs, "GATEUP", 1)


@pytest.mark.parametrize("build", ["lean", "gemms", "families"])
def test_isolated_builds_are_the_step_kernels_data(bench, monkeypatch, build):
    """--isolated-builds' kernels: the step kernel's buffers, norm table, weights, split-K
    workspace and split opcodes, M class, hand-off, backoff, claim policy and journal size,
    journaled, with the
    build's GEMM slots and families: lean only the isolated opcode's slot, gemms every slot (and
    QKV_ROPE's metadata, inverse frequencies and K/V caches), families the opcode's slot with
    attention and gather."""
    import types

    import mk.megakernel as M
    from mk.ir import Op
    made = {}

    class Fake:
        def __init__(self, *args, **kw):
            made.update(args=args, kw=kw)
    monkeypatch.setattr(M, "Megakernel", Fake)
    ops = {op: object() for op in (Op.QKV_ROPE, Op.O_PROJ, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)}
    counters, journal = types.SimpleNamespace(numel=lambda: 1 << 20), types.SimpleNamespace(
        shape=(4096, 40))
    step = types.SimpleNamespace(arena="arena", normw="normw", n_layers=80, eps=1e-5,
                                 counters=counters, timeout_ns=10 * 10**9, journal=journal,
                                 handoff="thread", backoff_ns=200, gemm=ops, gemm_m=1024,
                                 splitk="splitk", split_ops=frozenset({9}),
                                 claim_after_loads=True, meta="meta",
                                 inv_freq="inv_freq", kv="kv", attn="attn", embed="embed",
                                 last_normed="last_normed", l2_prefetch="l2_prefetch")
    bench.build_kernel(step, "GATE_UP", build)
    assert made["args"] == ("arena", "normw", 80, 1e-5)
    kw = made["kw"]
    assert kw["gemm"] == (ops if build == "gemms" else {Op.GATE_UP: ops[Op.GATE_UP]})
    assert kw["gemm_m"] == 1024
    assert kw["journal"] is True and kw["journal_capacity"] == 4096
    assert kw["n_counters"] == 1 << 20 and kw["timeout_s"] == 10.0
    assert (kw["handoff"], kw["backoff_ns"], kw["splitk"], kw["split_ops"],
            kw["claim_after_loads"]) == ("thread", 200, "splitk", frozenset({9}), True)
    families = {k for k in ("attn", "embed", "last_normed", "kv", "meta", "inv_freq",
                            "l2_prefetch") if k in kw}
    assert families == {"lean": set(), "gemms": {"meta", "inv_freq", "kv"},
                        "families": {"attn", "embed", "last_normed", "kv", "meta",
                                     "l2_prefetch"}}[build]
    assert all(kw[k] == k for k in families)


def test_isolated_runs_each_build_once_and_profiles_the_named_launch(bench, monkeypatch):
    """isolated_runs: every opcode's tiles through the step's kernel ("full") and each build,
    a build's kernel made once per opcode ("gemms" once for all), each kernel launched twice
    (warm, timed) with its journal cleared between, and only the named build's timed launch of
    that opcode between cudaProfilerStart / Stop."""
    import types

    import torch

    import mk.trace as tr
    from mk.ir import INSTR_WORDS, W_LAYER, W_OPCODE, Op
    rows = []
    for layer in range(3):
        for op in (Op.GATE_UP, Op.DOWN):
            w = torch.zeros(INSTR_WORDS, dtype=torch.int32)
            w[W_OPCODE], w[W_LAYER] = int(op), layer
            rows.append(w)
    plan = types.SimpleNamespace(instrs=torch.stack(rows))
    events = []

    class Kernel:
        def __init__(self, name):
            self.name = name
            self.journal = types.SimpleNamespace(
                zero_=lambda: events.append(("zero", self.name)))

        def prepare(self, sub):
            return sub

        def launch(self, handle, check):
            events.append(("launch", self.name, int(handle[0, W_OPCODE])))

        def journal_rows(self, n):
            return None, None
    made = []

    def build_kernel(mk, op, build):
        made.append((op, build))
        return Kernel(build)
    monkeypatch.setattr(bench, "build_kernel", build_kernel)
    monkeypatch.setattr(tr, "by_opcode", lambda j, c, n: {"ops": {}})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append(("start",)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append(("stop",)))
    step = {"ops": {"GATE_UP": {"own_mean_us": 5.0}}}
    out = bench.isolated_runs(Kernel("full"), plan, "GATE_UP,DOWN", 3, step, 0,
                              builds=["lean", "gemms"], profile="lean:DOWN")
    assert made == [("GATE_UP", "lean"), ("GATE_UP", "gemms"), ("DOWN", "lean")]
    assert set(out) == {"GATE_UP", "DOWN"}
    assert set(out["DOWN"]["builds"]) == {"lean", "gemms"}
    assert out["GATE_UP"]["count"] == 1 and out["GATE_UP"]["step_own_mean_us"] == 5.0
    launches = [e[1:] for e in events if e[0] == "launch"]
    # the journal cleared between the warm and the timed launch (stale K-trace words)
    for k, e in enumerate(events):
        if e[0] == "zero":
            assert events[k - 1][:2] == ("launch", e[1]) and events[k + 1] in (
                ("start",), ("launch", e[1], events[k - 1][2])), events[k - 1:k + 2]
    assert sum(e[0] == "zero" for e in events) == len(launches) // 2
    down, gate_up = int(Op.DOWN), int(Op.GATE_UP)
    assert launches == [(b, o) for o in (gate_up, down) for b in ("full", "lean", "gemms")
                        for _ in range(2)]
    i = events.index(("start",))
    assert events[i - 2:i] == [("launch", "lean", down), ("zero", "lean")]
    assert events[i + 1] == ("launch", "lean", down)
    assert events[i + 2] == ("stop",) and events.count(("start",)) == 1


@pytest.mark.parametrize("decode,context,prefill", [(3, 40, 0), (2, 33, 9)])
def test_seeded_megakernel_cache_computes_the_peers_step(bench, decode, context, prefill):
    """The megakernel's comparison with the eager peer at a benchmark point rests on the same
    cached K / V on both sides: seed_megakernel_kv writes StepPeer(seed)'s random cache into the
    paged cache of megakernel_batch's pages. Checked with the interpreter (the megakernel's own
    oracle, same cache layout) on the CPU, float32: its step's logits equal the peer's, and
    megakernel_agrees accepts them and refuses garbage."""
    from types import SimpleNamespace

    import torch

    from mk.config import ParallelConfig
    from mk.peers import StepPeer, random_rank_weights
    from mk.plan import PlanConfig
    from mk.tiny import TINY_CONFIG
    from mk.vm import VM

    w = random_rank_weights(TINY_CONFIG, ParallelConfig(), "cpu", dtype=torch.float32, seed=3)
    point = bench.Point("mixed" if prefill else "decode", decode, context, prefill)
    kernel = bench.megakernel_kernel_config(point)
    kernel = type(kernel)(page_size=kernel.page_size, max_seqs=8, max_context=kernel.max_context,
                          max_batch_tokens=64, num_kv_pages=kernel.num_kv_pages)
    vm = VM([w], kernel, PlanConfig(), device="cpu")
    be = SimpleNamespace(model=TINY_CONFIG, device=torch.device("cpu"),
                         kv_cache=lambda: vm.kv_cache(0))
    bench.seed_megakernel_kv(be, point, kernel, seed=5)
    peer = StepPeer(w, decode=decode, context=context, prefill=prefill, seed=5)
    ids = peer.ids.tolist()
    want = peer.step().float()
    got = vm.step(bench.megakernel_batch(point, kernel, ids)).float()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    res = {"status": "ok"}
    bench.megakernel_agrees(point, res, got, want)
    assert res["status"] == "ok" and res["rel_err_vs_eager"] < 1e-4
    bench.megakernel_agrees(point, res, torch.randn_like(want), want)
    assert res["status"] == "error" and "differs from the eager step" in res["error"]


def test_journal_breakdown_adds_the_table_by_kind_of_instruction(bench, capsys):
    """--journal's breakdown: besides the per-opcode table, one row per kind of instruction
    (mk.trace.variant_names) when the opcodes hide several: a mixed step's QKV_ROPE tiles of
    decode rows and of prompt rows apart, with their own epilogue medians (fake backend and
    journal: the launch is the GPU's)."""
    import types

    import torch

    import mk.trace as tr
    from mk.batch import SeqChunk, StepBatch
    from mk.instructions import qkv as qk
    from mk.ir import INSTR_WORDS, W_OPCODE, W_ROW0, W_ROWS, Op

    instrs = torch.zeros(2, INSTR_WORDS, dtype=torch.int32)
    for i, (row0, rows) in enumerate([(0, 1), (1, 3)]):
        instrs[i, W_OPCODE], instrs[i, W_ROW0], instrs[i, W_ROWS] = int(Op.QKV_ROPE), row0, rows
        instrs[i, qk.A_SECTION] = qk.SEC_Q
    j = torch.zeros(2, 32, dtype=torch.int64)
    for i, (t0, epi) in enumerate([(1000, 1000), (20000, 8000)]):
        j[i, :7] = torch.tensor([i, i, int(Op.QKV_ROPE), t0, t0 + 500, t0 + 15000, i])
        j[i, tr.ROLE_WORDS["cons0"]] = t0 + 1000
        j[i, tr.ROLE_WORDS["cons1"]] = t0 + 12000
        j[i, tr.ROLE_WORDS["cons_epi0"]] = t0 + 12000 - epi
    ctas = torch.tensor([[0, 40000, 0], [0, 40000, 1]])
    plan = types.SimpleNamespace(instrs=instrs)

    class Kernel:
        def launch(self, handle, check):
            pass

        def journal_rows(self, n):
            return j[:n], ctas

    be = types.SimpleNamespace(journal=False, _kernels={},
                               model=types.SimpleNamespace(num_layers=1),
                               planner=types.SimpleNamespace(plan=lambda batch: plan),
                               prepare=lambda batch: (Kernel(), None, plan))
    batch = StepBatch([SeqChunk([5], 7, [0]), SeqChunk([1, 2, 3], 0, [1])])
    point = types.SimpleNamespace(label="mixed", slug="mixed")
    args = types.SimpleNamespace(journal_isolated="", out=None)
    r = bench.journal_breakdown(be, batch, point, args)
    assert set(r["ops"]) == {"QKV_ROPE"}
    v = r["by_variant"]["ops"]
    assert set(v) == {"QKV_ROPE.q/decode", "QKV_ROPE.q/prompt"}
    assert v["QKV_ROPE.q/decode"]["cons_epi_us"] == pytest.approx(1.0)
    assert v["QKV_ROPE.q/prompt"]["cons_epi_us"] == pytest.approx(8.0)
    assert "by kind of instruction" in capsys.readouterr().err
    assert be.journal is False                  # the backend's journal switch is put back


def test_batch_none_runs_the_mixed_step_alone(bench):
    """--batch none: no decode point, the --mixed step alone (gpu_next.sh's clocks step times
    it per system); a --context given with it is not read."""
    args = bench.parse_args(["--shape", "tiny", "--device", "cpu", "--batch", "none",
                             "--context", "64", "--mixed", "2:32:8"])
    points = bench.resolve(args, 1, 0)["points"]
    assert [(p.kind, p.decode, p.context, p.prefill) for p in points] == [("mixed", 2, 32, 8)]


def test_rep_gap_rests_before_each_timed_rep_only(bench, monkeypatch):
    """--rep-gap-ms: the timer sleeps that long before each timed rep (not before the warm-up
    steps, not inside a rep's time); 0 (the default) never sleeps."""
    import torch
    slept, calls = [], []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    timer = bench.Timer(torch.device("cpu"), rep_gap_ms=250)
    ms = timer.run(lambda: calls.append(len(slept)), warmup=2, reps=3)
    assert slept == [0.25] * 3 and calls == [0, 0, 1, 2, 3] and len(ms) == 3
    slept.clear()
    bench.Timer(torch.device("cpu")).run(lambda: None, warmup=1, reps=2)
    assert slept == []


def test_interleaved_reps_rotate_and_pair_up(bench):
    """Timer.run_interleaved (--plan-ab): every fn warmed up `warmup` times, then rep i runs them
    all in an order rotated by i, each after its own before(k, i); the times come back per fn in
    rep order (rep i of one fn beside rep i of the others: their ratio pairs them)."""
    import torch
    calls, befores = [], []
    fns = [lambda k=k: calls.append(k) for k in range(3)]
    out = bench.Timer(torch.device("cpu")).run_interleaved(
        fns, 2, 4, lambda k, i: befores.append((k, i)))
    assert [len(o) for o in out] == [4, 4, 4] and all(t >= 0 for o in out for t in o)
    timed = calls[6:]
    assert sorted(calls[:6]) == [0, 0, 1, 1, 2, 2]
    assert timed == [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]
    assert befores[6:] == [(k, i) for i, k in zip([0] * 3 + [1] * 3 + [2] * 3 + [3] * 3, timed)]


def test_plan_ab_variants_go_over_the_plan_and_share_the_kernel(bench):
    """--plan-ab's variants are --plan's fields with their own over them; plans that change only
    the instruction stream (the attention's order and cuts) have the backend's kernel signature,
    the ones that change the buffers or the folded weights do not (prepare_variant refuses
    them: they are timed as runs of their own)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from host_step import rank_model

    from mk.config import ParallelConfig
    from mk.megakernel_step import default_plan_config, kernel_signature
    assert bench.plan_variants("cr:attn_chunk_reduce=0 l2:attn_lpt=2,kv_split=256",
                               "kv_split=128") == {
        "cr": {"kv_split": 128, "attn_chunk_reduce": 0},
        "l2": {"kv_split": 256, "attn_lpt": 2}}
    model = rank_model()
    point = bench.Point("mixed", 0, 1, 4096)
    kernel = bench.megakernel_kernel_config(point)
    sig = lambda **f: kernel_signature(default_plan_config(model, **f), model,  # noqa: E731
                                       ParallelConfig(), kernel, point.tokens)
    base = sig()
    for same in ({"attn_lpt": 2}, {"attn_chunk_reduce": 0}, {"attn_chunk_rows": 32},
                 {"raster_blocks": 4}):
        assert sig(**same) == base, same
    for other in ({"kv_split": 2048}, {"norm_fold": 2}, {"split_k": 1}):
        assert sig(**other) != base, other


def test_plan_ab_times_each_variant_on_its_own_stream_and_metadata(bench, monkeypatch):
    """time_megakernel with --plan-ab variants (a fake backend on the CPU): each variant's
    stream is prepared once and checked by a first launch, every timed rep of a plan runs with
    that plan's metadata copied in (then the rep's token ids), and the report pairs each
    variant's reps with the base's."""
    import types

    import torch

    from mk.instructions import _common as mc
    from mk.plan import PlanConfig
    T, off, n = 2, 10, 16
    pool = torch.arange(40, dtype=torch.int32).view(20, 2)

    def plan_of(marker: int):
        meta = torch.full((n,), marker, dtype=torch.int32)
        meta[mc.M_OFF_TOKENS] = off
        return types.SimpleNamespace(meta=types.SimpleNamespace(tensor=meta, num_tokens=T),
                                     instrs=torch.zeros(marker, 4))
    seen = []
    be = types.SimpleNamespace(meta=torch.zeros(n, dtype=torch.int32), device=torch.device("cpu"),
                               plan_cfg=PlanConfig(attn_lpt=1, attn_chunk_splits=1,
                                                   attn_chunk_reduce=1))
    mk = types.SimpleNamespace(grid=1, check=lambda: None)
    mk.launch = lambda h, check=True: seen.append(("launch", h, int(be.meta[0])))
    mk.launcher = lambda h: lambda: seen.append((h, int(be.meta[0]), be.meta[off:off + T].tolist()))
    be.prepare = lambda batch: (mk, "base", plan_of(1))
    cfgs = []

    def prepare_variant(batch, cfg):
        cfgs.append(cfg)
        h = f"v{len(cfgs)}"
        return mk, h, plan_of(1 + len(cfgs)), plan_of(1 + len(cfgs)).meta.tensor
    be.prepare_variant = prepare_variant
    monkeypatch.setattr(bench, "host_full_step_ms", lambda *a, **k: 0.0)
    res = bench.time_megakernel(be, None, pool, bench.Timer(torch.device("cpu")), 1, 3, False,
                                {"a": {"attn_lpt": 2}, "b": {"attn_chunk_reduce": 0}})
    assert [c.attn_lpt for c in cfgs] == [2, 1] and cfgs[1].attn_chunk_reduce == 0
    assert ("launch", "v1", 2) in seen and ("launch", "v2", 3) in seen
    runs = [s for s in seen if s[0] != "launch"]
    marker = {"base": 1, "v1": 2, "v2": 3}
    assert all(m == marker[h] for h, m, _ in runs), runs
    timed = runs[-9:]                           # 3 reps x 3 plans, rotated
    assert [h for h, _, _ in timed] == ["base", "v1", "v2", "v1", "v2", "base", "v2", "base",
                                        "v1"]
    assert [tok for _, _, tok in timed[:3]] == [pool[0].tolist()] * 3
    assert set(res["plan_ab"]) == {"a", "b"} and res["plan_ab"]["a"]["instructions"] == 2
    assert res["plan_ab"]["b"]["plan"] == {"attn_chunk_reduce": 0}
    assert res["plan_ab"]["a"]["ratio"]["reps"] == 3 and res["reps"] == 3


def test_host_full_step_times_a_full_plan_and_its_upload(bench, capsys):
    """host_full_step_ms (the JSON's host_full_step_ms / host_full_step_whole_upload_ms): a full
    plan of the batch (not the fast path), its check on the representative rows, its upload
    (device_stream, or the whole stream) and the metadata copy, on the backend's planner
    settings; the metadata left is the batch's. A failure is logged and gives None (the step is
    still timed)."""
    import types

    import torch

    from mk.batch import SeqChunk, StepBatch
    from mk.config import KernelConfig, ModelConfig, ParallelConfig
    from mk.plan import PlanConfig, Planner
    model = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=6, num_heads=8,
                        num_kv_heads=2, head_dim=8, vocab_size=256)
    kernel = KernelConfig(token_block=8, page_size=4, max_batch_tokens=96, max_seqs=8,
                          max_context=128, num_kv_pages=200)
    cfg = PlanConfig(kv_split=16)
    be = types.SimpleNamespace(model=model, kernel=kernel, plan_cfg=cfg,
                               planner=Planner(model, ParallelConfig(), kernel, cfg),
                               device=torch.device("cpu"),
                               meta=torch.zeros(1 << 14, dtype=torch.int32))
    streams = []
    mk = types.SimpleNamespace(prepare=lambda s, meta_page_size=None, check_stream=None:
                               streams.append((s, check_stream)))
    batch = StepBatch([SeqChunk([5], 7, list(range(4))), SeqChunk(list(range(1, 12)), 0,
                                                                   list(range(4, 8)))])
    for whole in (False, True):
        ms = bench.host_full_step_ms(be, batch, mk, False, whole=whole)
        assert isinstance(ms, float) and ms >= 0
    want = Planner(model, ParallelConfig(), kernel, cfg, fast_path=False).plan(batch)
    assert len(streams) == 8 and all(torch.equal(s, want.instrs) for s, _ in streams)
    assert all(len(c) < len(want.instrs) for _, c in streams)        # the representative rows
    assert torch.equal(be.meta[:want.meta.tensor.numel()], want.meta.tensor)
    be.planner = None
    assert bench.host_full_step_ms(be, batch, mk, False) is None
    assert "host_full_step_ms failed" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["generate_overlap", "launch_host"])
def test_gpu_benchmarks_refuse_bad_arguments_and_a_missing_gpu(script, capsys):
    """The GPU-only benchmark scripts: a bad count is an argparse error; without a Hopper GPU
    they say so and exit 1 (no traceback)."""
    import torch
    spec = importlib.util.spec_from_file_location(f"mk_bench_{script}",
                                                  ROOT / "bench" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as e:
        mod.main(["--reps" if script == "launch_host" else "--rounds", "0"])
    assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err
    if script == "generate_overlap":
        with pytest.raises(SystemExit) as e:
            mod.main(["--job", "16:128:128:256", "--job", "16:128:0:256"])
        assert e.value.code == 2 and "'16:128:0:256' is not SEQS" in capsys.readouterr().err
    if torch.cuda.is_available():
        return                      # the GPU run is the script's own (gpu_next.sh)
    assert mod.main([]) == 1
    assert "error:" in capsys.readouterr().err
