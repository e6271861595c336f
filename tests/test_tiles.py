"""mk.tiles: the GEMM tile table shared by the planner and the GPU bodies; default plans of
Llama-70B TP8 shapes satisfy the GPU bodies' tile predicate (the one mk.megakernel.check_plan
applies) at every M class."""

from __future__ import annotations

import numpy as np
import pytest

from mk import tiles
from mk.batch import SeqChunk, StepBatch
from mk.config import KernelConfig, ModelConfig, ParallelConfig
from mk.instructions import matmul as mm
from mk.instructions import qkv as qk
from mk.ir import W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0, W_ROWS, Op
from mk.plan import PlanConfig, Planner, plan_step

LLAMA_70B = ModelConfig(hidden_size=8192, intermediate_size=28672, num_layers=2, num_heads=64,
                        num_kv_heads=8, head_dim=128, vocab_size=128256)
KERNEL_70B = KernelConfig(token_block=128, page_size=16, max_batch_tokens=4096, max_seqs=4096,
                          max_context=4096, num_kv_pages=65536)
MS = (1, 64, 128, 256, 1024, 4096)


def test_table_classes():
    """The classes and picks the GPU compile gate and GEMM_NOTES describe."""
    for m, cls in ((1, 0), (64, 0), (65, 1), (128, 1), (129, 2), (256, 2), (257, 3), (1024, 3),
                   (1025, 4), (4096, 4)):
        assert tiles.m_class(m) == cls, m
        assert tiles.class_fewest_tokens(m) == (1, 65, 129, 257, 1025)[cls]
        assert tiles.class_largest_tokens(m, 4096) == (64, 128, 256, 1024, 4096)[cls]
    # O_PROJ / DOWN: m128n128 at 128 < M <= 256 since session 18 (128 tiles at B=256, not 64),
    # m64n64 at M <= 64 since session 64 and m128n64 at 64 < M <= 128 since session 65 (128
    # whole tiles, not 64 split in two)
    for m, want in ((64, "m64n64"), (65, "m128n64"), (128, "m128n64"), (129, "m128n128"),
                    (256, "m128n128"), (257, "m128n256"), (1024, "m128n256"),
                    (4096, "m128n256")):
        assert tiles.tile_name(Op.O_PROJ, m) == want
        assert tiles.tile_name(Op.DOWN, m) == want
    # GATE_UP: half-width tiles at 64 < M <= 256 since session 16, full ones around them (the
    # 1024 class went back to two B pages with the op-major queue in session 17); on 112-row B
    # pages up to 1024 tokens since session 20 (112 / 56 output columns); half-width at M <= 64
    # too since session 71
    assert [tiles.tile_shape(Op.GATE_UP, m).bn for m in (64, 256, 1024, 4096)] == \
        [56, 56, 112, 128]
    assert [tiles.tile_shape(Op.GATE_UP, m).b_rows for m in (64, 256, 1024, 4096)] == \
        [112, 112, 112, 128]
    # QKV_ROPE: one head per 128-row tile in every class (m64n256 at M <= 64 until session 14)
    assert all(tiles.tile_name(Op.QKV_ROPE, m) == "m128n128" for m in MS)
    # LM_HEAD: 128 vocab columns a tile up to 64 sequences, 256 above (sessions 26 / 27)
    assert [tiles.tile_shape(Op.LM_HEAD, m).bn for m in (64, 65, 256, 257, 1024, 4096)] == \
        [128, 256, 256, 256, 256, 256]
    for op, names in tiles.TILE_TABLE.items():
        assert len(names) == len(tiles.M_CLASSES) + 1
        for name in names:
            assert tiles.TILE_SHAPES[name].gate_up == (op == Op.GATE_UP)
        bms = [tiles.TILE_SHAPES[n].bm for n in names]
        assert bms == sorted(bms), "BM must not shrink as M grows (LM_HEAD row tiles rely on it)"


def test_gpu_configs_derive_from_the_table():
    pytest.importorskip("cutlass")
    from mk.instructions import _gemm_kernel as gk
    assert gk.TILE_TABLE is tiles.TILE_TABLE and gk.M_CLASSES is tiles.M_CLASSES
    assert gk.BK == tiles.BK and gk.B_ROWS == tiles.B_ROWS
    assert set(gk.TILES) == set(tiles.TILE_SHAPES)
    for name, cfg in gk.TILES.items():
        s = tiles.TILE_SHAPES[name]
        assert isinstance(cfg, gk.TileConfig)
        assert (cfg.name, cfg.bm, cfg.nb, cfg.wn, cfg.wg, cfg.gate_up, cfg.bn) == \
            (s.name, s.bm, s.nb, s.wn, s.wg, s.gate_up, s.bn)
    for op in tiles.TILE_TABLE:
        for m in (1, 63, 64, 65, 200, 256, 257, 1000, 1024, 1025, 4096, 10 ** 6):
            assert gk.choose_tile(op, m) is gk.TILES[tiles.tile_name(op, m)]


def batch_of(m: int) -> StepBatch:
    """A step of m token rows: decodes, plus prefill chunks above 64 tokens."""
    nxt = [0]

    def seq(n, start):
        pages = -(-(start + n) // KERNEL_70B.page_size)
        p0 = nxt[0]
        nxt[0] += pages
        return SeqChunk([1] * n, start, list(range(p0, p0 + pages)))
    if m <= 64:
        return StepBatch([seq(1, 100 + i) for i in range(m)])
    dec = m // 4
    pre = m - dec
    chunks = [pre // 3, pre // 3, pre - 2 * (pre // 3)]
    return StepBatch([seq(1, 500 + i) for i in range(dec)] + [seq(c, 64 * i) for i, c in enumerate(chunks)])


def gemm_words(s: np.ndarray, op):
    p = s[(s[:, W_OPCODE] == int(op))]
    kw = qk.A_K if op == Op.QKV_ROPE else mm.A_K
    return p, p[:, W_ROW0], p[:, W_ROWS], p[:, W_COL0], p[:, W_COLS], p[:, kw]


def check_tile_widths(cols, col0, width, bn):
    """Column tiles are exactly bn wide except the last one of each range [k*width, (k+1)*width)
    (a rank's slice of H for O_PROJ / DOWN, the whole local width otherwise)."""
    assert ((cols == bn) | ((col0 + cols) % width == 0)).all()


@pytest.mark.parametrize("tp_rank", [0, 7])
@pytest.mark.parametrize("m", MS)
def test_default_plan_satisfies_the_gpu_tiles(m, tp_rank):
    par = ParallelConfig(8, tp_rank)
    batch = batch_of(m)
    assert batch.num_tokens == m
    plan = plan_step(batch, LLAMA_70B, par, KERNEL_70B, PlanConfig())
    S = len(batch.seqs)
    tl = plan.tiles
    assert tl.m == m
    # the widths the planner chose are the table's BN, the token block fits every token GEMM's BM
    assert tl.o == tiles.tile_shape(Op.O_PROJ, m).bn and tl.down == tiles.tile_shape(Op.DOWN, m).bn
    assert tl.mlp == tiles.tile_shape(Op.GATE_UP, m).bn
    assert tl.lm == tiles.tile_shape(Op.LM_HEAD, m).bn
    assert tl.qkv == tiles.tile_shape(Op.QKV_ROPE, m).bn       # 128 / 256: whole heads of 128
    assert tl.token_block == (64 if m <= 64 else 128)
    s = plan.instrs.numpy()
    seen = set()
    for op in tiles.GEMM_TILE_OPS:
        p, row0, rows, col0, cols, K = gemm_words(s, op)
        assert len(p), op
        seen.add(op)
        # the megakernel compiles one variant per M class of the token count
        shape = tiles.tile_shape(op, m)
        qkv = op == Op.QKV_ROPE
        err = tiles.gemm_tile_error(op.name, shape, row0, rows, col0, cols, K,
                                    p[:, qk.A_HEAD_DIM] if qkv else None,
                                    p[:, qk.A_SEC_COL0] if qkv else None)
        assert err is None, (m, op.name, err)
        assert (K % 64 == 0).all() and (rows <= shape.bm).all() and (cols <= shape.bn).all()
        if op == Op.LM_HEAD:
            # its row tiles (sequences) also fit the BM of the sequence count's class
            assert (rows <= tiles.tile_shape(op, S).bm).all()
        bn = tiles.tile_shape(op, m).bn
        assert cols.max() == bn, (op.name, cols.max(), bn)
        H = LLAMA_70B.hidden_size
        if op in (Op.O_PROJ, Op.DOWN):
            check_tile_widths(cols, col0, H // 8, bn)
        elif op == Op.GATE_UP:
            check_tile_widths(cols, col0, LLAMA_70B.intermediate_size // 8, bn)
        elif op == Op.LM_HEAD:
            check_tile_widths(cols, col0, LLAMA_70B.vocab_size // 8, bn)
        else:
            D = LLAMA_70B.head_dim
            sec = p[:, qk.A_SECTION]
            sec_end = np.where(sec == 0, 8 * D, np.where(sec == 1, 9 * D, 10 * D))
            assert ((cols == bn) | (col0 + cols == sec_end)).all()
    assert seen == set(tiles.GEMM_TILE_OPS)
    # rows of every layer's token GEMMs stay inside one token block
    tb = tl.token_block
    for op in tiles.TOKEN_GEMM_OPS:
        p = s[(s[:, W_OPCODE] == int(op)) & (s[:, W_LAYER] == 0)]
        assert ((p[:, W_ROW0] % tb) == 0).all()


def test_small_steps_take_one_row_norms():
    """Steps of at most small_norm_max_tokens tokens cut their norms into small_norm_rows-row
    instructions (1 by default: the norms are on a small step's critical path), larger steps
    into norm_rows; small_norm_max_tokens 0 turns the rule off, and an explicit norm_rows below
    small_norm_rows stays."""
    cfg = PlanConfig(norm_fill_max_tokens=0)
    assert cfg.norm_rows_for(cfg.small_norm_max_tokens) == cfg.small_norm_rows == 1
    assert cfg.norm_rows_for(cfg.small_norm_max_tokens + 1) == cfg.norm_rows == 8
    assert PlanConfig(small_norm_max_tokens=0, norm_fill_max_tokens=0).norm_rows_for(1) == 8
    assert PlanConfig(norm_rows=2, small_norm_rows=4).norm_rows_for(16) == 2
    with pytest.raises(ValueError, match="small_norm_rows must be a positive integer"):
        PlanConfig(small_norm_rows=0)
    with pytest.raises(ValueError, match="small_norm_max_tokens must be an integer >= 0"):
        PlanConfig(small_norm_max_tokens=-1)
    for n, rows in ((64, 1), (65, 8)):                  # 64 decodes; 16 decodes + 49 prefill
        batch = batch_of(n)
        plan = Planner(LLAMA_70B, ParallelConfig(8, 0), KERNEL_70B, cfg).plan(batch)
        s = plan.instrs.numpy()
        norms = s[s[:, W_OPCODE] == int(Op.RMSNORM), W_ROWS]
        assert norms.max() == rows and norms.sum() == 2 * LLAMA_70B.num_layers * n
        lm_norms = s[s[:, W_OPCODE] == int(Op.LM_NORM), W_ROWS]
        assert lm_norms.max() <= rows and lm_norms.sum() == len(batch.seqs)


def test_mid_steps_take_about_one_norm_instruction_per_sm():
    """Up to norm_fill_max_tokens tokens a norm takes ceil(tokens / num_sms) rows per instruction
    (at least small_norm_rows, at most norm_rows): at B=256 two rows, 128 instructions for 132
    SMs, not 32 of eight; B=512 four; above the cap norm_rows."""
    cfg = PlanConfig()
    assert cfg.norm_fill_max_tokens == 1024
    for n, rows in ((64, 1), (65, 1), (132, 1), (133, 2), (256, 2), (257, 2), (512, 4),
                    (1024, 8), (1025, 8)):
        assert cfg.norm_rows_for(n) == rows, n
    assert PlanConfig(norm_fill_max_tokens=256).norm_rows_for(257) == 8
    assert PlanConfig(num_sms=16).norm_rows_for(256) == 8          # capped by norm_rows
    assert PlanConfig(small_norm_rows=4, small_norm_max_tokens=0).norm_rows_for(100) == 4
    with pytest.raises(ValueError, match="norm_fill_max_tokens must be an integer >= 0"):
        PlanConfig(norm_fill_max_tokens=-1)
    for n in (200, 256):
        batch = batch_of(n)
        plan = Planner(LLAMA_70B, ParallelConfig(8, 0), KERNEL_70B, cfg).plan(batch)
        s = plan.instrs.numpy()
        norms = s[(s[:, W_OPCODE] == int(Op.RMSNORM)) & (s[:, W_LAYER] == 0), W_ROWS]
        assert norms.max() == 2 and norms.sum() == 2 * n
        assert len(norms) == 2 * -(-n // 2)


def test_big_steps_take_about_one_norm_instruction_per_sm():
    """From big_norm_min_tokens tokens on a norm takes ceil(tokens / num_sms) rows per
    instruction again, at least norm_rows and at most big_norm_rows (session 47: 32 rows at
    B=4096, -2%; 32 rows at B=1024 and in the 1280-token mixed step did not pay, so those keep
    norm_rows); 0 turns the rule off; an explicit norm_rows above the cap stays."""
    cfg = PlanConfig()
    assert (cfg.big_norm_min_tokens, cfg.big_norm_rows) == (2048, 32)
    for n, rows in ((1280, 8), (2047, 8), (2048, 16), (2049, 16), (3000, 23), (4096, 32),
                    (16384, 32)):
        assert cfg.norm_rows_for(n) == rows, n
    assert PlanConfig(big_norm_min_tokens=0).norm_rows_for(4096) == 8
    assert PlanConfig(norm_rows=64).norm_rows_for(4096) == 64
    assert PlanConfig(num_sms=1024).norm_rows_for(4096) == 8        # at least norm_rows
    with pytest.raises(ValueError, match="big_norm_rows must be a positive integer"):
        PlanConfig(big_norm_rows=0)
    with pytest.raises(ValueError, match="big_norm_min_tokens must be an integer >= 0"):
        PlanConfig(big_norm_min_tokens=-1)
    n = 4096
    batch = batch_of(n)
    plan = Planner(LLAMA_70B, ParallelConfig(8, 0), KERNEL_70B, cfg).plan(batch)
    s = plan.instrs.numpy()
    norms = s[(s[:, W_OPCODE] == int(Op.RMSNORM)) & (s[:, W_LAYER] == 0), W_ROWS]
    assert norms.max() == 32 and norms.sum() == 2 * n and len(norms) == 2 * n // 32


def test_explicit_values_override_the_table():
    cfg = PlanConfig(qkv_tile=384, o_tile=64, mlp_tile=512, down_tile=128, lm_tile=1024, token_block=32)
    plan = Planner(LLAMA_70B, ParallelConfig(8, 0), KERNEL_70B, cfg).plan(batch_of(256))
    t = plan.tiles
    assert (t.qkv, t.o, t.mlp, t.down, t.lm, t.token_block) == (384, 64, 512, 128, 1024, 32)
    s = plan.instrs.numpy()
    for op, w in ((Op.O_PROJ, 64), (Op.GATE_UP, 512), (Op.DOWN, 128), (Op.LM_HEAD, 1024)):
        assert s[s[:, W_OPCODE] == int(op), W_COLS].max() == w
    assert s[s[:, W_OPCODE] == int(Op.QKV_ROPE), W_COLS].max() == 384
    assert s[s[:, W_OPCODE] == int(Op.QKV_ROPE), W_ROWS].max() == 32         # token_block
    assert s[s[:, W_OPCODE] == int(Op.RMSNORM), W_ROWS].max() == cfg.norm_rows_for(256)
    # ...and the GPU predicate says which of them the bodies cannot run
    p, row0, rows, col0, cols, K = gemm_words(s, Op.GATE_UP)
    assert "cols <= 56" in tiles.gemm_tile_error("GATE_UP", tiles.tile_shape(Op.GATE_UP, 256),
                                                  row0, rows, col0, cols, K)


def test_token_block_capped_by_the_kernel_config():
    k = KernelConfig(token_block=32, page_size=16, max_batch_tokens=4096, max_seqs=4096,
                     max_context=4096, num_kv_pages=65536)
    assert plan_step(batch_of(1024), LLAMA_70B, ParallelConfig(8, 0), k).tiles.token_block == 32
    assert tiles.default_token_block(1024) == 128 and tiles.default_token_block(256) == 128
    assert tiles.default_token_block(64) == 64
    assert tiles.default_token_block(4096, 256) == 128


def test_predicate_catches_each_violation():
    sh = tiles.tile_shape(Op.O_PROJ, 4096)           # m128n256
    a = lambda *v: np.array(v)                       # noqa: E731
    ok = dict(row0=a(0, 128), rows=a(128, 5), col0=a(0, 256), cols=a(256, 256), K=a(1024, 1024))
    assert tiles.gemm_tile_error("O_PROJ", sh, **ok) is None
    for key, bad, msg in (("K", a(1024, 1000), "multiple of 64"), ("cols", a(256, 264), "cols <= 256"),
                          ("cols", a(256, 12), "multiples of 8"), ("col0", a(4, 256), "multiples of 8"),
                          ("rows", a(129, 5), "rows <= 128"), ("rows", a(0, 5), "rows <= 128")):
        err = tiles.gemm_tile_error("O_PROJ", sh, **{**ok, key: bad})
        assert err and msg in err, (key, err)
    q = tiles.tile_shape(Op.QKV_ROPE, 64)            # m64n256
    args = dict(row0=a(0), rows=a(64), col0=a(1024 + 64), cols=a(128), K=a(8192))
    err = tiles.gemm_tile_error("QKV_ROPE", q, **args, head_dim=a(128), sec_col0=a(1024))
    assert "whole heads" in err
    err = tiles.gemm_tile_error("QKV_ROPE", q, **{**args, "col0": a(1024)}, head_dim=a(64),
                                sec_col0=a(1024))
    assert "head_dim 128" in err
    assert tiles.gemm_tile_error("QKV_ROPE", q, **{**args, "col0": a(1024)}, head_dim=a(128),
                                 sec_col0=a(1024)) is None


@pytest.mark.parametrize("m", MS)
def test_megakernel_check_plan_accepts_default_gemm_tiles(m):
    """mk.megakernel.check_plan itself (operand bounds included) on a TP-1 default plan's token
    GEMMs and LM head, with the slots the megakernel compiles for the step's M class (meta tensors:
    no memory)."""
    pytest.importorskip("cutlass")
    import torch

    import mk.megakernel as M
    from mk.instructions.base import Buf
    md = LLAMA_70B
    par = ParallelConfig(1, 0)
    plan = plan_step(batch_of(m), md, par, KERNEL_70B, PlanConfig())
    T, H, L, I = KERNEL_70B.max_batch_tokens, md.hidden_size, md.num_layers, md.intermediate_size
    QW, KVW = md.num_heads * md.head_dim, md.num_kv_heads * md.head_dim

    def e(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16, device="meta")
    gemm = {
        Op.QKV_ROPE: M.GemmOperands(e(T, H), e(L, QW + 2 * KVW, H), e(T, QW), int(Buf.NORMED), int(Buf.Q)),
        Op.O_PROJ: M.GemmOperands(e(T, QW), e(L, H, QW), e(T, H), int(Buf.ATTN_OUT), int(Buf.HIDDEN)),
        Op.GATE_UP: M.GemmOperands(e(T, H), e(L, 2 * I, H), e(T, I), int(Buf.NORMED), int(Buf.MLP_ACT)),
        Op.DOWN: M.GemmOperands(e(T, I), e(L, H, I), e(T, H), int(Buf.MLP_ACT), int(Buf.HIDDEN)),
        Op.LM_HEAD: M.GemmOperands(e(T, H), e(md.vocab_size, H),
                                   torch.empty(T, md.vocab_size, dtype=torch.float32, device="meta"),
                                   int(Buf.LAST_NORMED), int(Buf.LOGITS)),
    }
    slots = M.gemm_slots(gemm, m)
    s = plan.instrs
    keep = torch.zeros(len(s), dtype=torch.bool)
    for op in gemm:
        keep |= s[:, W_OPCODE] == int(op)
    kv_rows = L * KERNEL_70B.kv_pages * KERNEL_70B.page_size
    M.check_plan(s[keep].contiguous(), 8, T, H, plan.num_counters, gemm=gemm, slots=slots,
                 kv_shape=(2, kv_rows, KVW))
    # and it refuses the former defaults (mlp_tile 256 > GATE_UP's 128 columns)
    bad = plan_step(batch_of(m), md, par, KERNEL_70B, PlanConfig(mlp_tile=256)).instrs
    with pytest.raises(ValueError, match="GATE_UP tiles need"):
        M.check_plan(bad[bad[:, W_OPCODE] == int(Op.GATE_UP)].contiguous(), 8, T, H,
                     plan.num_counters, gemm=gemm, slots=slots)


@pytest.mark.parametrize("m,cols,per_layer",
                         [(256, 56, 1024), (1024, 112, 2048), (4096, 128, 7168)])
def test_gate_up_tiles_per_class(m, cols, per_layer):
    """GATE_UP's tiles of the table's class at m tokens: 56 output columns (gu_m128n56, one
    112-row B page of 56 gate + 56 up rows) at 64 < M <= 256, 112 up to 1024 (gu_m128n112), 128
    above (gu_m128); unsplit (split_k 1), so (token blocks) x 28672 / cols tiles per layer.
    (The plans' GPU tile predicate and check_plan at each class:
    test_default_plan_satisfies_the_gpu_tiles and
    test_megakernel_check_plan_accepts_default_gemm_tiles.)"""
    plan = plan_step(batch_of(m), LLAMA_70B, ParallelConfig(1, 0), KERNEL_70B, PlanConfig())
    s = plan.instrs.numpy()
    gu = s[s[:, W_OPCODE] == int(Op.GATE_UP)]
    assert int(gu[:, W_COLS].max()) == cols
    assert len(gu) == per_layer * LLAMA_70B.num_layers


@pytest.mark.parametrize("m,tiles_per_block,nsplit", [(1, 32, 4), (64, 32, 4), (128, 64, 2),
                                                      (256, 64, 1), (512, 32, 1), (1024, 32, 1)])
def test_112_row_gate_up_tiles_plan(monkeypatch, m, tiles_per_block, nsplit):
    """MK_TILES=GATE_UP@64=gu_m64n112,GATE_UP@256=gu_m128n56,GATE_UP@1024=gu_m128n112 (session
    19's A/B candidates: 112-row B pages, 112 / 56 / 112 output columns): at 70B TP8 GATE_UP's
    3584 columns per rank in 32 / 64 / 32 tiles per token block, split as auto split-K splits
    them: 128 units for 132 SMs at B <= 64 (32 x 4; the table's 28 x 4 = 112), B=128 (64 x 2),
    B=256 and 512 (the table's: 112), and every GATE_UP instruction keeps the GPU bodies' tile
    predicate."""
    monkeypatch.setattr(tiles, "TILE_TABLE", tiles.table_overrides(
        "GATE_UP@64=gu_m64n112,GATE_UP@256=gu_m128n56,GATE_UP@1024=gu_m128n112"))
    shape = tiles.tile_shape(Op.GATE_UP, m)
    assert shape.bn == (56 if 64 < m <= 256 else 112) and shape.b_rows == 112
    par = ParallelConfig(8, 0)
    plan = plan_step(batch_of(m), LLAMA_70B, par, KERNEL_70B, PlanConfig(split_k=0))
    nblk = -(-m // tiles.default_token_block(m, KERNEL_70B.token_block))
    assert plan.layout["splitk"]["GATE_UP"] == (nblk * tiles_per_block, nsplit)
    s = plan.instrs.numpy()
    gu = s[(s[:, W_OPCODE] == int(Op.GATE_UP)) & (s[:, W_LAYER] == 0)]
    assert len(gu) == nblk * tiles_per_block * nsplit
    assert int(gu[:, W_COLS].max()) == shape.bn
    err = tiles.gemm_tile_error("GATE_UP", shape, gu[:, W_ROW0], gu[:, W_ROWS], gu[:, W_COL0],
                                gu[:, W_COLS], gu[:, mm.A_K])
    assert err is None, err
