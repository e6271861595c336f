"""GPU correctness of the ATTENTION / ATTN_REDUCE bodies (mk/instructions/_attention_kernel.py)
through the standalone harness (bench/attention.py): plans made by mk.plan for real batches (decode
at several contexts with split-KV, prefill chunks with start_pos > 0, GQA groupings, page sizes),
outputs poisoned with NaN, unused KV-cache rows NaN, against the torch faces of attention.py, and
the signal counters against the plan's targets. `pytest -m gpu tests/test_attention_gpu.py`."""

from __future__ import annotations

import pytest
import torch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")]


def _cases():
    from bench.attention import case_list
    return case_list(quick=True)


NAMES = ["decode-ctx512-b64", "decode-ctx2048-b64", "decode-ctx8192-b32", "decode-varlen",
         "prefill-chunks", "prefill-1k-at-3k", "mixed-page64", "gqa-qpk4-2groups",
         "gqa-qpk2-heads2"]


@pytest.mark.parametrize("name", NAMES)
def test_attention_matches_torch_face(name):
    from bench.attention import check_case
    case = next(c for c in _cases() if c["name"] == name)
    r = check_case(case, seed=1)
    assert r["finite"], r
    assert r["counters_ok"], r
    assert r["rel_err"] < 2e-2, r
    assert r["ok"], r


@pytest.mark.parametrize("name", ["decode-varlen", "prefill-chunks"])
def test_attention_warp_handoff(name):
    """The per-warp done/empty hand-off (share 8) gives the same results as the megakernel's
    default per-thread one (share 256) that the cases above run."""
    from bench.attention import check_case
    from bench import attention as ba
    case = next(c for c in _cases() if c["name"] == name)
    old = ba.HANDOFF
    ba.HANDOFF = "warp"
    try:
        r = check_case(case, seed=1)
    finally:
        ba.HANDOFF = old
    assert r["ok"], r


def test_attention_replay_is_deterministic():
    """Two launches of the same prepared problem give bit-identical outputs."""
    from bench.attention import AttnHarness, case_list, make_problem
    case = next(c for c in case_list(quick=True) if c["name"] == "prefill-chunks")
    h = AttnHarness(make_problem(case, seed=2))
    go = h.launchers()
    go()
    torch.cuda.synchronize()
    first = h.out.clone()
    h.counters.zero_()
    go()
    torch.cuda.synchronize()
    h.check_state()
    assert torch.equal(torch.nan_to_num(first), torch.nan_to_num(h.out))
