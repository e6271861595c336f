"""bench/probes/norm_fold_probe.py's algebra (session 37's design probe for removing the RMSNORM
phases): RMSNorm folded into the GEMM after it, r * (h @ (W * g)^T), is the reference's
RMSNorm(h) @ W^T up to rounding: exactly so in float32, and within the bf16 parity bound of the
float32 model end to end on one of the tests' random checkpoints."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from _compile_gate import probe_module
from mk.reference import rms_norm


def test_folded_norm_is_the_norm_then_the_gemm_in_float32():
    probe = probe_module("norm_fold_probe")
    g = torch.Generator().manual_seed(0)
    h = torch.randn(5, 64, generator=g) * 3
    w = torch.randn(48, 64, generator=g)
    gain = 1 + 0.3 * torch.randn(64, generator=g)
    want = F.linear(rms_norm(h, gain, 1e-5), w)
    got = probe.normed_linear(h, probe.fold(w, gain), 1e-5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the negative control: the gain left out of the folded weight is a different function
    assert (probe.normed_linear(h, w, 1e-5) - want).abs().max() > 0.1


def test_folded_model_tracks_float32_like_the_reference(tmp_path):
    from conftest import NAMED_CONFIGS, make_hf_checkpoint
    from mk.engine import available_backends
    probe = probe_module("norm_fold_probe")
    ckpt, _ = make_hf_checkpoint(tmp_path, **NAMED_CONFIGS["GQA_LLAMA3"])
    kw = dict(device="cpu", page_size=4, num_kv_pages=256, progress=False)
    n = 8
    fp32 = probe.make_engine(ckpt, "reference", torch.float32, **kw)
    forced = probe.greedy_fp32(fp32, n)
    truth = probe.teacher_forced(fp32, forced, n)
    err = {}
    for backend in ("reference", "norm_fold"):
        eng = probe.make_engine(ckpt, backend, torch.bfloat16, **kw)
        err[backend] = probe.compare(truth, probe.teacher_forced(eng, forced, n))
    assert err["norm_fold"]["max_rel_err"] <= probe.BF16_REL_TOL, err
    assert err["norm_fold"]["argmax_flips_on_clear_steps"] == 0, err
    # and it is a bf16 model: not the float32 one by accident
    assert err["norm_fold"]["max_rel_err"] > 1e-4, err
    assert "norm_fold" not in available_backends()     # the probe's backend was not left behind
