"""GPU correctness of the GEMM-tile bodies (mk/instructions/_gemm_kernel.py) run inside the
megakernel (mk/megakernel.py, via bench.gemm.MkGemm): every opcode's fused epilogue against its torch face
(mk.instructions.matmul / qkv), output poisoned outside the tile rows, bf16 relative error < 1e-2.
`pytest -m gpu tests/test_gemm_gpu.py`; skips cleanly without a Hopper GPU."""

from __future__ import annotations

import pytest
import torch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")]

# (op, M): M picks the tile config (gk.TILE_TABLE): 64 -> m64n64 (O_PROJ / DOWN since session 64),
# m64n128 (LM_HEAD), 40 -> the same tiles with a rows tail, 128 / 100 (a rows tail) -> O_PROJ /
# DOWN on m128n64 (the 65..128 class since session 65), 200 (odd:
# the rows tail) -> the M <= 256 tiles (BM = 128 since session 7: O_PROJ / DOWN m128n128 (since
# session 18; m128n256 before), gu_m128n56 (since session 20), LM_HEAD m128n256 (since session
# 27), QKV m128n128), 1024 -> the BM = 128 tiles (m128n256, gu_m128n112, m128n128; LM_HEAD
# m128n256 since session 26); GATE_UP at 2048: gu_m128 (the M > 1024 class)
CASES = [("O_PROJ", 64), ("DOWN", 64), ("DOWN", 40), ("O_PROJ", 128), ("DOWN", 100),
         ("LM_HEAD", 64), ("GATE_UP", 2048)] + [
    (op, m) for op in ("O_PROJ", "DOWN", "GATE_UP", "LM_HEAD", "QKV_ROPE") for m in (200, 1024)]


@pytest.mark.parametrize("op,m", CASES, ids=[f"{o}-M{m}" for o, m in CASES])
def test_gemm_tile_matches_torch_face(op, m):
    from bench.gemm import check_case
    r = check_case(op, m, seed=m)
    assert r["finite"], r
    assert r["poison_intact"], r
    assert r["rel_err"] < 1e-2, r
    assert r["ok"], r


def test_gemm_megakernel_replays_without_host_reset():
    """Two launches of one prepared plan: the last CTA out resets counters and the queue head."""
    from bench.gemm import SHAPES, MkGemm, make_problem, plan_tiles
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import Op
    K, _, NO, src, dst = SHAPES["GATE_UP"]
    cfg = gk.choose_tile(Op.GATE_UP, 256)
    x, w, y = make_problem("GATE_UP", 256)
    instrs, _ = plan_tiles(Op.GATE_UP, cfg, 256, NO, K, layer=1, src=int(src), dst=int(dst))
    h = MkGemm(Op.GATE_UP, 256)
    prep = h.prepare(instrs, x, w, y)
    h.launch(prep)
    first = y.clone()
    h.launch(prep)
    torch.cuda.synchronize()
    assert torch.equal(first[:256], y[:256])


def test_rows_and_gemm_in_one_megakernel():
    """RMSNORM (rows family, warpgroup 0) -> GATE_UP (GEMM, both warpgroups) -> RMSNORM of the
    next layer in one launch and one page ring: GATE_UP reads NORMED from the rows arena
    (z = src word) and waits on the row tile's RMSNORM counter; compared with the torch faces."""
    import types

    import mk.megakernel as M
    from mk.instructions import _gemm_kernel as gk
    from mk.instructions.base import Buf, NormWeight, family_of
    from mk.instructions.matmul import A_DST, A_EPI, A_K, A_SRC, Epi
    from mk.instructions.rows import rows_instruction
    from mk.ir import ARG0, NUM_ARGS, Instruction, Op, deserialize, serialize
    T, H, I, L = 256, 1024, 512, 2
    g = torch.Generator().manual_seed(3)
    arena = torch.randn(3, T, H, generator=g).bfloat16()
    w = types.SimpleNamespace(
        attn_norm=(1 + 0.1 * torch.randn(L, H, generator=g)).bfloat16(),
        mlp_norm=(1 + 0.1 * torch.randn(L, H, generator=g)).bfloat16(),
        final_norm=(1 + 0.1 * torch.randn(H, generator=g)).bfloat16(),
        gate_up=(torch.randn(L, 2 * I, H, generator=g) / H ** 0.5).bfloat16(),
        config=types.SimpleNamespace(rms_norm_eps=1e-5))
    act = torch.full((T, I), float("nan")).bfloat16()
    cfg = gk.choose_tile(Op.GATE_UP, T)
    ins, ctr = [], 0
    for r0 in range(0, T, cfg.bm):
        ins.append(rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.NORMED, r0, cfg.bm, 0, H, layer=1,
                                    norm_weight=NormWeight.MLP, waits=[], signal=ctr))
        n = 0
        for c0 in range(0, I, cfg.bn):
            args = [0] * NUM_ARGS
            args[A_SRC - ARG0], args[A_DST - ARG0] = int(Buf.NORMED), int(Buf.MLP_ACT)
            args[A_EPI - ARG0], args[A_K - ARG0] = int(Epi.SILU_MUL), H
            ins.append(Instruction(int(Op.GATE_UP), layer=1, row0=r0, rows=cfg.bm, col0=c0,
                                   cols=min(cfg.bn, I - c0), waits=[(ctr, 1)], signal=ctr + 1,
                                   args=args))
            n += 1
        # the next layer's norm of the same rows into SCRATCH, after the GEMM read NORMED
        ins.append(rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.SCRATCH, r0, cfg.bm, 0, H,
                                    layer=0, norm_weight=NormWeight.ATTN,
                                    waits=[(ctr + 1, n)], signal=ctr + 2))
        ctr += 3
    stream = serialize(ins)

    bufs = {int(Buf.HIDDEN): arena[0].clone(), int(Buf.NORMED): arena[1].clone(),
            int(Buf.SCRATCH): arena[2].clone(), int(Buf.MLP_ACT): act.clone()}
    st = types.SimpleNamespace(weights=w, rank=0, buf=lambda i, rank=None: bufs[int(i)])
    for x in deserialize(stream):
        family_of(x.opcode).run_torch(x, st)

    ga, gact = arena.cuda(), act.cuda()
    gw = w.gate_up.cuda()
    import os
    tmo = float(os.environ.get("MK_TEST_TIMEOUT_S", 2.0))   # longer under compute-sanitizer
    mkk = M.Megakernel(ga, M.norm_table(w).cuda(), L, 1e-5, verbose=True, timeout_s=tmo,
                       gemm={Op.GATE_UP: M.GemmOperands(ga, gw, gact, 0, int(Buf.MLP_ACT))},
                       gemm_m=T)
    mkk.launch(mkk.prepare(stream), check=False)
    mkk.wait(max(30.0, 4 * tmo))
    mkk.check()
    torch.cuda.synchronize()
    got = ga.cpu()
    for b in (Buf.HIDDEN, Buf.NORMED, Buf.SCRATCH):
        assert torch.allclose(got[int(b)].float(), bufs[int(b)].float(), rtol=2e-2, atol=2e-2), b
    ga_ = gact.cpu().float()
    ref = bufs[int(Buf.MLP_ACT)].float()
    assert torch.isfinite(ga_).all()
    assert ((ga_ - ref).norm() / ref.norm()).item() < 1e-2


VARIANT_CASE = r'''
import json, sys
sys.path.insert(0, {root!r})
import bench.gemm as bg
from mk import tiles
from mk.ir import Op
{check}
bg.SPLIT_K = {split!r}
print(json.dumps(bg.check_case({op!r}, {m}, seed={m})))
'''


def _variant_case(op: str, m: int, env: dict, split: str = "auto", check: str = "") -> dict:
    """bench.gemm.check_case of op at M = m in a subprocess with the environment updated by env
    (MK_TILES and the GEMM bodies' switches are read at import), output poisoned outside the
    tile rows; split: bench.gemm's --split-k; check: a line run there first (the variant took)."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = VARIANT_CASE.format(root=root, op=op, m=m, split=split, check=check)
    r = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, **env), cwd=root,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _gate_up_tile_case(tile: str, cls: str, m: int, split: str = "auto") -> dict:
    """GATE_UP at M = m with MK_TILES=GATE_UP@cls=tile (_variant_case)."""
    return _variant_case("GATE_UP", m, {"MK_TILES": f"GATE_UP@{cls}={tile}"}, split,
                         f"assert tiles.tile_name(Op.GATE_UP, {m}) == {tile!r}")


@pytest.mark.parametrize("m", [200, 256])
def test_two_page_gate_up_tile_at_256_matches_torch_face(m):
    """gu_m128 in the M <= 256 class (the table's tile there until session 16, kept for A/Bs as
    MK_TILES=GATE_UP@256=gu_m128; the rows tail at 200) against GATE_UP's torch face."""
    res = _gate_up_tile_case("gu_m128", "256", m)
    assert res["finite"] and res["poison_intact"] and res["rel_err"] < 1e-2 and res["ok"], res


@pytest.mark.parametrize("tile,cls,m", [("gu_m64n112", "64", 64), ("gu_m64n112", "64", 13),
                                        ("gu_m128n56", "64", 64), ("gu_m128n56", "64", 13),
                                        ("gu_m128n56", "256", 200), ("gu_m128n56", "256", 128),
                                        ("gu_m128n112", "1024", 512), ("gu_m128n112", "1024", 300)])
def test_112_row_gate_up_tiles_match_torch_face(tile, cls, m):
    """The 112-row B page gate/up tiles (session 19: 112 / 56 / 112 output columns, wgmma N =
    56 per warpgroup / 112; 32 / 64 / 32 tiles per token block at 70B TP8 where gu_m64 /
    gu_m128n64 / gu_m128 make 28 / 56 / 28; A/B candidates via MK_TILES) against GATE_UP's
    torch face, whole tiles and split along K as the planner splits (M <= 64: 32 tiles x 4,
    M=128: 64 x 2). gu_m128n56 in the M <= 64 class (session 69's candidate: 64 tiles x 2,
    128-row wgmmas over at most 64 tokens)."""
    for split in ("none", "auto"):
        res = _gate_up_tile_case(tile, cls, m, split)
        assert res["finite"] and res["poison_intact"] and res["rel_err"] < 1e-2 and res["ok"], \
            (split, res)


