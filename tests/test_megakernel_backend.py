"""`--backend megakernel` outside its test mode (CPU): clear errors, exit code 1, no traceback.

A model step needs opcodes the megakernel has no GPU body for yet, so launch/generate.py
--backend megakernel must stop at once with a one-line error: on a machine without a GPU "needs a
CUDA GPU", on a GPU a NotImplementedError naming the missing opcodes (its GPU twin is in
test_megakernel_gpu.py). The rows-only test mode is `python -m mk.megakernel selftest`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run_cpu(args, timeout=300):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT) + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def _has_cutlass():
    import importlib.util
    return importlib.util.find_spec("cutlass") is not None


def test_generate_backend_megakernel_without_gpu_fails_cleanly():
    r = _run_cpu(["launch/generate.py", "--backend", "megakernel", "--max-new-tokens", "2"])
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    if _has_cutlass():
        assert last.startswith("error: RuntimeError:") and "needs a CUDA GPU" in last, last
    else:   # the backend module cannot load: the engine says so
        assert last.startswith("error: ValueError:") and "unavailable" in last, last


def test_selftest_without_gpu_fails_cleanly():
    r = _run_cpu(["-m", "mk.megakernel", "selftest"], timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    msg = r.stderr.strip().splitlines()[-1]
    assert ("needs a CUDA GPU" in msg) if _has_cutlass() else ("CuTe DSL" in msg), msg


def test_selftest_usage():
    pytest.importorskip("cutlass")
    r = _run_cpu(["-m", "mk.megakernel"], timeout=120)
    assert r.returncode == 2 and "usage: python -m mk.megakernel selftest" in r.stderr


def test_model_step_raises_not_implemented_naming_opcodes(monkeypatch):
    """The GPU branch, simulated: a full model's backend fails at construction."""
    pytest.importorskip("cutlass")
    import torch

    import mk.megakernel as M
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with pytest.raises(NotImplementedError) as ei:
        M.MegakernelBackend(weights=None)
    msg = str(ei.value)
    for name in ("ATTENTION", "EMBED", "TP_REDUCE"):   # the GEMM tiles have bodies now
        assert name in msg
    assert "python -m mk.megakernel selftest" in msg
    assert isinstance(ei.value, RuntimeError)   # generate.py reports it as one line, exit 1
