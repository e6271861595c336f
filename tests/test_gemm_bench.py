"""bench/gemm.py on the CPU: its torch.compile peer's function is the eager peer's math, and it is
timed only once its output matches eager torch's (compile_peer_check / compile_peer_result); the
--suite orchestration under MK_GEMM_DRYRUN (faked checks and timings)."""

from __future__ import annotations

import math

import pytest
import torch

import bench.gemm as bg


def _inputs(op: str, m: int, k: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) / math.sqrt(k)).bfloat16()
    out_dtype = torch.float32 if op == "LM_HEAD" else torch.bfloat16
    y = torch.randn(m, n // 2 if op == "GATE_UP" else n, generator=g).to(out_dtype)
    return x, w, y


@pytest.mark.parametrize("op", ["O_PROJ", "DOWN", "GATE_UP", "LM_HEAD"])
def test_epilogue_fn_is_the_eager_peers_math(monkeypatch, op):
    """epilogue_fn(op) (what torch.compile compiles) returns what bench/gemm.py's eager peer
    (torch_fns) writes into the output rows, on small shapes (GATE_UP's split point shrunk)."""
    monkeypatch.setattr(bg, "I_LOCAL", 8)
    m, k, n = 5, 32, 16
    x, w, y = _inputs(op, m, k, n)
    wl = w if op == "LM_HEAD" else torch.stack([torch.zeros_like(w), w])   # the layer-1 slice
    args = (x, w, y.clone()) if op in ("O_PROJ", "DOWN") else (x, w)
    want = bg.epilogue_fn(op)(*args)
    _, eager = bg.torch_fns(op, x, wl, y, m)
    eager()
    assert want.dtype == y.dtype and want.shape == y.shape
    assert torch.equal(want, y)


def test_a_matching_compiled_peer_is_timed():
    x, w, y = _inputs("O_PROJ", 4, 32, 16)
    f = bg.epilogue_fn("O_PROJ")
    rel = bg.compile_peer_check(lambda: f(x, w, y), lambda: f(x, w, y))
    assert rel == 0.0
    assert bg.compile_peer_result(rel, 12.5, None) == (12.5, None)


def test_a_wrong_compiled_peer_is_not_timed():
    """A peer that leaves the residual out differs by far more than the tolerance: no time, and
    the error says why."""
    x, w, y = _inputs("DOWN", 4, 32, 16)
    f = bg.epilogue_fn("DOWN")
    rel = bg.compile_peer_check(lambda: torch.matmul(x, w.t()), lambda: f(x, w, y))
    assert rel > bg.COMPILE_TOL
    us, err = bg.compile_peer_result(rel, 12.5, None)
    assert us is None and "differs from eager torch" in err


def test_a_compiled_peer_that_writes_nothing_fails_on_the_poison():
    """In-place peers (QKV_ROPE's q / K / V writes): the buffers are poisoned between the eager
    run and the compiled one, so a peer that skips a write leaves NaN and fails (rel inf)."""
    q = torch.zeros(4, 8, dtype=torch.bfloat16)
    src = torch.randn(4, 8).bfloat16()

    def write():
        q.copy_(src)
    rel = bg.compile_peer_check(lambda: None, write, lambda: [q], lambda: q.fill_(float("nan")))
    assert rel == float("inf")
    assert bg.compile_peer_result(rel, 3.0, None)[0] is None
    rel = bg.compile_peer_check(write, write, lambda: [q], lambda: q.fill_(float("nan")))
    assert rel == 0.0


def test_a_peer_that_raised_keeps_its_error():
    assert bg.compile_peer_result(None, None, "BackendCompilerFailed: x") == \
        (None, "BackendCompilerFailed: x")


def _suite(tmp_path, dryrun: str, ops: str):
    """bench/gemm.py --suite on the CPU with MK_GEMM_DRYRUN (faked checks and timings: the
    orchestration only): (exit code, the JSON it wrote)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "gemm.json"
    env = dict(os.environ, MK_GEMM_DRYRUN=dryrun)
    r = subprocess.run([sys.executable, str(root / "bench" / "gemm.py"), "--suite", "--ops", ops,
                        "--m", "64,256", "--odd-m", "0", "--reps", "3", "--bench-timeout", "240",
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=600,
                       cwd=str(root))
    return r.returncode, json.loads(out.read_text())


def test_suite_times_every_op_whose_checks_passed(tmp_path):
    """The suite (gpu_next.sh's gemm / gemmtc steps): every op's checks, then its timing, one
    row per (op, M), and the record says all checks passed."""
    rc, res = _suite(tmp_path, "1", "O_PROJ,GATE_UP")
    assert rc == 0 and res["all_checks_pass"] is True
    assert sorted((r["op"], r["m"]) for r in res["rows"]) == \
        [("GATE_UP", 64), ("GATE_UP", 256), ("O_PROJ", 64), ("O_PROJ", 256)]
    assert all(r["mk_us"] > 0 and r["ratio_vs_torch"] > 0 for r in res["rows"])


def test_suite_does_not_time_an_op_that_failed_its_checks(tmp_path):
    rc, res = _suite(tmp_path, "fail:DOWN", "O_PROJ,DOWN")
    assert rc != 0 and res["all_checks_pass"] is False
    assert {r["op"] for r in res["rows"] if "mk_us" in r} == {"O_PROJ"}
