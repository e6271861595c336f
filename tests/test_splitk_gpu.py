"""GPU correctness of split-K through the megakernel (mk/instructions/_gemm_kernel.py's split tiles,
mk/instructions/_splitk_kernel.py's SPLITK_REDUCE): per opcode (O_PROJ, DOWN, GATE_UP, QKV_ROPE; the
Llama-70B TP8 rank shapes of bench/gemm.py) at M 1 / 64 / 256 with nsplit 2 / 4 / 8, each unsplit
tile of a whole GEMM cut into nsplit K slices + one reduce, outputs and the SPLITK workspace poisoned
(NaN), against (1) the torch faces of the same split stream (mk.instructions: the split tiles'
float32 partials, then the reduce; the partials cell by cell) and (2) the unsplit stream's faces;
the unsplit stream through the split-K variant (its nsplit < 2 path); then the one-layer tiny
model's steps with split_k forced vs mk.vm (mk.megakernel_step.check_against_vm).

`pytest -m gpu tests/test_splitk_gpu.py`; skips cleanly without a Hopper GPU."""

from __future__ import annotations

import types

import pytest
import torch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")]

OPS = ("O_PROJ", "DOWN", "GATE_UP", "QKV_ROPE")
# nsplit 1: the unsplit stream through the variant with split-K compiled in (its run-time
# nsplit < 2 path: the epilogue pages, as without split-K)
CASES = [(op, m, n) for op in OPS for m in (1, 64, 256) for n in (2, 4, 8)] + [
    (op, 200, 1) for op in OPS]


def run_faces(instrs, bufs: dict, weights, meta=None):
    """Every instruction's torch face (mk.instructions registry) in queue order on bufs."""
    from bench.gemm import FaceState
    from mk.instructions.base import family_of
    from mk.ir import deserialize
    st = FaceState(bufs, weights)
    if meta is not None:
        st.meta = types.SimpleNamespace(tensor=meta)
    for ins in deserialize(instrs.cpu()):
        family_of(ins.opcode).run_torch(ins, st)


def megakernel(op, m, x, w, y, splitk, meta=None, inv_freq=None, kv=None):
    """A megakernel with op's GEMM slot (M class of m) and the SPLITK workspace (bench.gemm.MkGemm
    plus splitk)."""
    import mk.megakernel as M
    from bench.gemm import SHAPES
    from mk.ir import Op
    arena = torch.zeros(3, 64, 1024, dtype=torch.bfloat16, device="cuda")
    normw = torch.zeros(3, 1024, dtype=torch.bfloat16, device="cuda")
    _, _, _, src, dst = SHAPES[op]
    g = M.GemmOperands(x, w, y, int(src), int(dst))
    return M.Megakernel(arena, normw, 1, 1e-5, timeout_s=2.0, verbose=False,
                        gemm={Op[op]: g}, gemm_m=max(m, 1), meta=meta, inv_freq=inv_freq, kv=kv,
                        splitk=splitk)


@pytest.mark.parametrize("op,m,nsplit", CASES, ids=[f"{o}-M{m}-s{n}" for o, m, n in CASES])
def test_split_tiles_and_reduce_match_torch_faces(op, m, nsplit):
    import bench.gemm as bg
    from mk.instructions import _gemm_kernel as gk
    from mk.instructions.base import Buf
    from mk.ir import Op
    cfg = gk.choose_tile(Op[op], m)
    K, N, NO, src, dst = bg.SHAPES[op]
    meta = invf = kv = None
    if op == "QKV_ROPE":
        x, w, y, kv, meta, invf = bg.make_qkv_problem(m, seed=nsplit)
        unsplit, nctr = bg.plan_qkv(cfg, m, bg.QKV_SECTIONS, K, bg.HEAD_DIM, layer=1,
                                    src=int(src), dst=int(dst))
        width, up = bg.QKV, 0
        weights = types.SimpleNamespace(qkv=w, config=types.SimpleNamespace(rope=bg.ROPE),
                                        dtype=torch.bfloat16)
    else:
        x, w, y = bg.make_problem(op, m, seed=nsplit)
        unsplit, nctr = bg.plan_tiles(Op[op], cfg, m, NO, K, layer=1, src=int(src), dst=int(dst))
        up = N // 2 if op == "GATE_UP" else 0
        width = 2 * up if op == "GATE_UP" else NO
        weights = bg.face_weights(op, w)
        weights.dtype = torch.bfloat16
    T = x.shape[0]
    stream = bg.split_stream(unsplit, nsplit, T, nctr, up)[0] if nsplit > 1 else unsplit
    sk = torch.full((max(nsplit, 2) * T, width), float("nan"), dtype=torch.float32,
                    device="cuda")
    y0, kv0 = y.clone(), (kv.clone() if kv is not None else None)

    # oracles: the split stream's faces, and the unsplit stream's faces, on copies
    def bufs_for(yy, kvv, skk):
        b = {int(src): x, int(dst): yy, int(Buf.SPLITK): skk}
        if kvv is not None:
            b[int(Buf.K_CACHE)], b[int(Buf.V_CACHE)] = kvv[0], kvv[1]
        return b
    ys, kvs, sks = y0.clone(), (kv0.clone() if kv0 is not None else None), sk.clone()
    run_faces(stream, bufs_for(ys, kvs, sks), weights, meta)
    yu, kvu = y0.clone(), (kv0.clone() if kv0 is not None else None)
    run_faces(unsplit, bufs_for(yu, kvu, None), weights, meta)

    mkk = megakernel(op, m, x, w, y, sk, meta, invf, kv)
    prepared = mkk.prepare(stream)          # check_plan accepts the split stream
    mkk.launch(prepared, check=False)
    mkk.wait(20.0)
    mkk.check()
    torch.cuda.synchronize()

    if op == "QKV_ROPE":
        written = ~torch.isnan(kvs)
        got = torch.cat((y[:m].flatten(), kv[written]))
        want_s = torch.cat((ys[:m].flatten(), kvs[written]))
        want_u = torch.cat((yu[:m].flatten(), kvu[written]))
        poison = bool(torch.isnan(y[m:]).all()) and bool(torch.isnan(kv[~written]).all())
    else:
        got, want_s, want_u = y[:m], ys[:m], yu[:m]
        poison = bool(torch.isnan(y[m:]).all())
    e_split, e_unsplit = bg.rel_err(got, want_s), bg.rel_err(got, want_u)
    # the partials themselves (before the reduce's rounding): the split tiles write exactly the
    # face's workspace cells, float32 x[:, k0:k1] @ W^T up to the summation order
    same_cells = bool(torch.equal(torch.isnan(sk), torch.isnan(sks)))
    cells = ~torch.isnan(sks)
    e_part = bg.rel_err(sk[cells], sks[cells])
    r = dict(op=op, m=m, nsplit=nsplit, tile=cfg.name, n_instr=int(stream.shape[0]),
             rel_err_vs_split_faces=e_split, rel_err_vs_unsplit_faces=e_unsplit,
             partial_rel_err=e_part, partial_cells_as_face=same_cells,
             finite=bool(torch.isfinite(got).all()), poison_intact=poison)
    print(r)
    assert r["partial_cells_as_face"], r   # store_partial's row / column masks and column map
    assert e_part < 1e-4, r                # float32 partials (K0, the K slice, the column map)
    assert r["finite"], r              # a partial never written, or a reduce of the wrong rows
    assert r["poison_intact"], r       # nothing written outside the tiles
    assert e_split < 1e-2 and e_unsplit < 1e-2, r


@pytest.mark.parametrize("split_k", [2, 4, 8])
def test_one_layer_step_split_k_forced_matches_vm(split_k):
    """The tiny head_dim-128 model, one layer: a mixed prefill step then decode steps (<= 256
    tokens each, so every QKV_ROPE / O_PROJ / GATE_UP / DOWN tile is split split_k ways), logits vs
    mk.vm running the same split plans (bf16 tolerance), greedy tokens equal, K/V caches close."""
    from mk.megakernel_step import check_against_vm
    r = check_against_vm(layers=1, split_k=split_k, decode_steps=2, verbose=False)
    print(r)
    assert r["split_instrs"] > 0, r
    assert r["passed"], r
    assert r["kv_cache_max_abs_diff"] < 0.1, r
