"""GPU correctness of split-K through the megakernel (mk/instructions/_gemm_kernel.py's split tiles,
mk/instructions/_splitk_kernel.py's SPLITK_REDUCE): per opcode (O_PROJ, DOWN, GATE_UP, QKV_ROPE; the
Llama-70B TP8 rank shapes of bench/gemm.py) at M 1 / 64 / 256 with nsplit 2 / 4 / 8, each unsplit
tile of a whole GEMM cut into nsplit K slices + one reduce, outputs and the SPLITK workspace poisoned
(NaN), against (1) the torch faces of the same split stream (mk.instructions: the split tiles'
float32 partials, then the reduce; the partials cell by cell) and (2) the unsplit stream's faces;
the unsplit stream through the split-K variant (its nsplit < 2 path); then the one-layer tiny
model's steps with split_k forced vs mk.vm (mk.megakernel_step.check_against_vm). The norm fold's
device side (PlanConfig.norm_fold): row-scaled reduces of GATE_UP / QKV_ROPE (the same cases with
ROW_SCALE in the workspace's tail) and the row-scale RMSNORM, plain and folded with a split
reduce, against the faces.

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


def megakernel(op, m, x, w, y, splitk, meta=None, inv_freq=None, kv=None, arena_rows=64):
    """A megakernel with op's GEMM slot (M class of m) and the SPLITK workspace (bench.gemm.MkGemm
    plus splitk); arena_rows: the (unused) arena's token rows T, where ROW_SCALE (the last T
    floats of splitk) has its rows."""
    import mk.megakernel as M
    from bench.gemm import SHAPES
    from mk.ir import Op
    arena = torch.zeros(3, arena_rows, 1024, dtype=torch.bfloat16, device="cuda")
    normw = torch.zeros(3, 1024, dtype=torch.bfloat16, device="cuda")
    _, _, _, src, dst = SHAPES[op]
    g = M.GemmOperands(x, w, y, int(src), int(dst))
    return M.Megakernel(arena, normw, 1, 1e-5, timeout_s=2.0, verbose=False,
                        gemm={Op[op]: g}, gemm_m=max(m, 1), meta=meta, inv_freq=inv_freq, kv=kv,
                        splitk=splitk)


def row_scale_of(sk: torch.Tensor, T: int) -> torch.Tensor:
    """ROW_SCALE [T, 1] as the GPU has it: a view of the SPLITK allocation's last T floats."""
    return sk.view(-1)[-T:].view(T, 1)


def split_case(op, m, nsplit, row_scale=False, epi_scale=False) -> dict:
    """One opcode's whole GEMM at M = m cut into nsplit K slices + reduces, through the megakernel
    and the faces (see the module docstring); row_scale: every reduce row-scaled (word
    A_ROW_SCALE, PlanConfig.norm_fold: QKV_ROPE / GATE_UP), with ROW_SCALE (the workspace's last
    T floats, T = the operands' rows = the arena's) random in [0.25, 0.75] and the workspace
    padded for it as mk.plan.splitk_shape does. epi_scale (nsplit 1, with row_scale): the
    unsplit tiles scale their rows themselves after an epilogue wait (A_EPI_WAIT,
    PlanConfig.norm_fold=2) on a counter a NOOP queued first signals. Returns the figures the
    tests assert on."""
    import bench.gemm as bg
    from mk.instructions import _gemm_kernel as gk
    from mk.instructions import splitk as skf
    from mk.instructions.base import Buf
    from mk.ir import W_OPCODE, Op
    from mk.plan import row_scale_rows
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
    reserved = 0
    if row_scale and epi_scale:
        assert nsplit == 1, "the epilogue scale is an unsplit tile's"
        from mk.instructions import _common as mc
        from mk.ir import Instruction, serialize
        tiles = stream.clone()
        tiles[:, mc.A_EPI_WAIT], tiles[:, mc.A_EPI_TARGET] = nctr + 1, 1     # counter nctr
        stream = torch.cat([serialize([Instruction(int(Op.NOOP), signal=nctr)]), tiles])
        reserved = row_scale_rows(T, width)
    elif row_scale:
        assert nsplit > 1, "only a split stream has reduces to scale"
        stream = stream.clone()
        stream[stream[:, W_OPCODE] == int(Op.SPLITK_REDUCE), skf.A_ROW_SCALE] = 1
        reserved = row_scale_rows(T, width)
    sk = torch.full((max(nsplit, 2) * T + reserved, width), float("nan"), dtype=torch.float32,
                    device="cuda")
    if row_scale:
        g = torch.Generator(device="cuda").manual_seed(nsplit)
        row_scale_of(sk, T).copy_(0.25 + 0.5 * torch.rand(T, 1, device="cuda", generator=g))
    scale0 = row_scale_of(sk, T).clone() if row_scale else None
    y0, kv0 = y.clone(), (kv.clone() if kv is not None else None)

    # oracles: the split stream's faces, and the unsplit stream's faces, on copies
    def bufs_for(yy, kvv, skk):
        b = {int(src): x, int(dst): yy, int(Buf.SPLITK): skk}
        if row_scale and skk is not None:
            b[int(Buf.ROW_SCALE)] = row_scale_of(skk, T)
        if kvv is not None:
            b[int(Buf.K_CACHE)], b[int(Buf.V_CACHE)] = kvv[0], kvv[1]
        return b
    ys, kvs, sks = y0.clone(), (kv0.clone() if kv0 is not None else None), sk.clone()
    run_faces(stream, bufs_for(ys, kvs, sks), weights, meta)
    yu, kvu = y0.clone(), (kv0.clone() if kv0 is not None else None)
    run_faces(unsplit, bufs_for(yu, kvu, None), weights, meta)

    mkk = megakernel(op, m, x, w, y, sk, meta, invf, kv, arena_rows=T if row_scale else 64)
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
             row_scale=row_scale, epi_scale=epi_scale, rel_err_vs_split_faces=e_split,
             rel_err_vs_unsplit_faces=e_unsplit, partial_rel_err=e_part,
             partial_cells_as_face=same_cells, finite=bool(torch.isfinite(got).all()),
             poison_intact=poison,
             row_scale_intact=(bool(torch.equal(row_scale_of(sk, T), scale0)) if row_scale
                               else None))
    print(r)
    return r


@pytest.mark.parametrize("op,m,nsplit", CASES, ids=[f"{o}-M{m}-s{n}" for o, m, n in CASES])
def test_split_tiles_and_reduce_match_torch_faces(op, m, nsplit):
    r = split_case(op, m, nsplit)
    e_part, e_split, e_unsplit = (r["partial_rel_err"], r["rel_err_vs_split_faces"],
                                  r["rel_err_vs_unsplit_faces"])
    assert r["partial_cells_as_face"], r   # store_partial's row / column masks and column map
    assert e_part < 1e-4, r                # float32 partials (K0, the K slice, the column map)
    assert r["finite"], r              # a partial never written, or a reduce of the wrong rows
    assert r["poison_intact"], r       # nothing written outside the tiles
    assert e_split < 1e-2 and e_unsplit < 1e-2, r


# the row-scaled reduces (PlanConfig.norm_fold): QKV_ROPE's and GATE_UP's only
SCALED_CASES = [(op, m, n) for op in ("GATE_UP", "QKV_ROPE") for m in (1, 64, 200) for n in (2, 4)]


@pytest.mark.parametrize("op,m,nsplit", SCALED_CASES,
                         ids=[f"{o}-M{m}-s{n}" for o, m, n in SCALED_CASES])
def test_row_scaled_reduce_matches_torch_faces(op, m, nsplit):
    """Every reduce of the split stream row-scaled (y = bf16(acc * ROW_SCALE[row]) before the
    epilogue: SiLU-mul of both scaled sums, RoPE of both scaled halves, the v section scaled):
    the output vs the split stream's faces; the unscaled (unsplit) faces as the negative control
    (scales in [0.25, 0.75]: a reduce that ignored them would match those instead); ROW_SCALE,
    the workspace's tail, never overwritten by a partial."""
    r = split_case(op, m, nsplit, row_scale=True)
    assert r["partial_cells_as_face"] and r["partial_rel_err"] < 1e-4, r
    assert r["finite"] and r["poison_intact"], r
    assert r["row_scale_intact"], r
    assert r["rel_err_vs_split_faces"] < 1e-2, r
    assert r["rel_err_vs_unsplit_faces"] > 0.1, r


# the unsplit tiles that scale their own rows (PlanConfig.norm_fold=2): M classes 64 / 256 /
# 1024 (GATE_UP's 112-row-page tiles there)
EPI_SCALED_CASES = [(op, m) for op in ("GATE_UP", "QKV_ROPE") for m in (1, 64, 200, 1024)]


@pytest.mark.parametrize("op,m", EPI_SCALED_CASES, ids=[f"{o}-M{m}" for o, m in EPI_SCALED_CASES])
def test_epilogue_scaled_tiles_match_torch_faces(op, m):
    """Unsplit QKV_ROPE / GATE_UP tiles with an epilogue wait (built in session 39, not yet
    GPU-run): the loader waits for the counter (a NOOP's signal) before the epilogue pages, the
    consumers scale every accumulator row by ROW_SCALE (y = bf16(acc * r), then SiLU-mul / RoPE):
    the output vs the row-scaled faces, the unscaled faces as the negative control (scales in
    [0.25, 0.75]); ROW_SCALE left as it was, nothing written outside the tiles."""
    r = split_case(op, m, 1, row_scale=True, epi_scale=True)
    assert r["finite"] and r["poison_intact"], r
    assert r["row_scale_intact"], r
    assert r["rel_err_vs_split_faces"] < 1e-2, r
    assert r["rel_err_vs_unsplit_faces"] > 0.1, r


# (folded reduce's nsplit, 0: a plain norm; rows): one row, and odd row counts (a group of
# NORM_ROW_BATCH rows with a missing row)
NORM_CASES = [(0, 1), (0, 13), (2, 1), (2, 13), (4, 6)]


@pytest.mark.parametrize("nsplit,rows", NORM_CASES,
                         ids=[f"{'fold-s%d' % n if n else 'plain'}-rows{r}" for n, r in NORM_CASES])
def test_row_scale_rmsnorm_matches_the_face(nsplit, rows):
    """A row-scale RMSNORM (destination ROW_SCALE, PlanConfig.norm_fold) through the step's variant
    (a GEMM slot: NORM_ROW_BATCH rows per group) with split-K, plain and folded with a split
    reduce (nsplit > 0: h = bf16(x + bf16(sum of the partials)) written back to HIDDEN first):
    ROW_SCALE (the SPLITK allocation's last T floats) vs the face (rows.row_scale) within float32
    rounding (another summation order, the hardware rsqrt); the arena bitwise (h, and no
    normalized rows anywhere: NORMED / SCRATCH keep their NaN poison); the partials and ROW_SCALE's
    other rows (NaN) as they were."""
    import bench.gemm as bg
    from mk.instructions import rows as rw
    from mk.instructions.base import Buf
    from mk.ir import ARG0, Op, serialize
    from mk.plan import row_scale_rows
    T, H, row0 = 64, 1024, 7     # megakernel(): arena [3, T, 1024], one layer, eps 1e-5
    eps = 1e-5
    ins = rw.rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.ROW_SCALE, row0, rows, 0, H)
    ins.args[rw.A_RED_NSPLIT - ARG0], ins.args[rw.A_RED_STRIDE - ARG0] = nsplit, T
    stream = serialize([ins])
    g = torch.Generator().manual_seed(100 * nsplit + rows)
    arena = torch.full((3, T, H), float("nan"), dtype=torch.bfloat16)
    arena[int(Buf.HIDDEN)] = torch.randn(T, H, generator=g).bfloat16()
    nparts = max(nsplit, 1) * T         # partial rows j * T + row of split j (stride T)
    sk = torch.full((nparts + row_scale_rows(T, H), H),
                    float("nan"))
    sk[:nparts] = torch.randn(nparts, H, generator=g)

    # the face on copies, ROW_SCALE a view of the allocation's tail as on the GPU
    want_arena, want_sk = arena.clone(), sk.clone()
    bufs = {int(Buf.HIDDEN): want_arena[0], int(Buf.NORMED): want_arena[1],
            int(Buf.SCRATCH): want_arena[2], int(Buf.SPLITK): want_sk,
            int(Buf.ROW_SCALE): row_scale_of(want_sk, T)}
    weights = types.SimpleNamespace(config=types.SimpleNamespace(rms_norm_eps=eps),
                                    dtype=torch.bfloat16)
    run_faces(stream, bufs, weights)

    x, w, y = bg.make_problem("GATE_UP", 64)
    gsk = sk.cuda()
    mkk = megakernel("GATE_UP", 64, x, w, y, gsk, arena_rows=T)
    mkk.arena.copy_(arena.cuda())
    mkk.launch(mkk.prepare(stream), check=False)   # check_plan accepts dst ROW_SCALE here
    mkk.wait(20.0)
    mkk.check()
    torch.cuda.synchronize()

    got_arena, got_sk = mkk.arena.cpu(), gsk.cpu()
    assert torch.equal(got_arena.view(torch.int16), want_arena.view(torch.int16)), \
        "arena differs from the face's (h rows, or normalized rows written)"
    mine = slice(row0, row0 + rows)
    got_s, want_s = row_scale_of(got_sk, T)[mine], row_scale_of(want_sk, T)[mine]
    print(f"row-scale RMSNORM nsplit {nsplit} rows {rows}: ROW_SCALE max rel err "
          f"{((got_s - want_s).abs() / want_s).max().item():.3g}")
    torch.testing.assert_close(got_s, want_s, rtol=1e-5, atol=0)
    for t in (got_sk, want_sk):        # everything else in the allocation: bitwise as it was
        row_scale_of(t, T)[mine] = 0
    assert torch.equal(got_sk.view(torch.int32), want_sk.view(torch.int32)), \
        "SPLITK written outside ROW_SCALE's rows of the norm"


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
