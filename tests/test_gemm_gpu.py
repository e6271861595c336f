"""GPU correctness of the GEMM-tile bodies (mk/instructions/_gemm_kernel.py) through the standalone
persistent harness (bench/gemm_harness.py): every opcode's fused epilogue against its torch face
(mk.instructions.matmul / qkv), output poisoned outside the tile rows, bf16 relative error < 1e-2.
`pytest -m gpu tests/test_gemm_gpu.py`; skips cleanly without a Hopper GPU."""

from __future__ import annotations

import pytest
import torch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")]

# (op, M): M picks the tile config (gk.TILE_TABLE): 64 -> m64n128 (O_PROJ/DOWN/LM_HEAD), 200 (odd:
# the rows tail) -> the M <= 256 tiles (m64n256 PAGE, gu_m64, m64n128, QKV m64n256), 1024 -> the
# BM = 128 tiles (m128n256, gu_m128, m128n128)
CASES = [("O_PROJ", 64), ("LM_HEAD", 64)] + [
    (op, m) for op in ("O_PROJ", "DOWN", "GATE_UP", "LM_HEAD", "QKV_ROPE") for m in (200, 1024)]


@pytest.mark.parametrize("op,m", CASES, ids=[f"{o}-M{m}" for o, m in CASES])
def test_gemm_tile_matches_torch_face(op, m):
    from bench.gemm import check_case
    r = check_case(op, m, seed=m)
    assert r["finite"], r
    assert r["poison_intact"], r
    assert r["rel_err"] < 1e-2, r
    assert r["ok"], r


def test_gemm_harness_replays_without_host_reset():
    """Two launches of one prepared plan: the last CTA out resets counters and the queue head."""
    from bench.gemm import SHAPES, make_problem
    from bench.gemm_harness import GemmHarness, plan_tiles
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import Op
    K, _, NO, _, _ = SHAPES["GATE_UP"]
    cfg = gk.choose_tile(Op.GATE_UP, 256)
    x, w, y = make_problem("GATE_UP", 256)
    instrs, _ = plan_tiles(Op.GATE_UP, cfg, 256, NO, K, layer=1)
    h = GemmHarness(Op.GATE_UP, cfg)
    prep = h.prepare(instrs, x, w, y)
    h.launch(prep)
    first = y.clone()
    h.launch(prep)
    torch.cuda.synchronize()
    assert torch.equal(first[:256], y[:256])
