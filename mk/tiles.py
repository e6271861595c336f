"""GEMM tile shapes: the one table shared by the planner and the GPU bodies.

CPU-importable (no cutlass). mk/instructions/_gemm_kernel.py derives its device-side TileConfig
objects from TILE_SHAPES / TILE_TABLE (`gk.choose_tile(op, M)` = `tiles.tile_shape(op, M)` with the
device methods); mk.plan takes its default column-tile widths and token block per step from the
same table (`step_tiles`), and `gemm_tile_error` is the tile predicate mk.megakernel.check_plan
applies before a launch (tests apply it to default plans on the CPU).

A tile is BM token rows x BN output columns of x @ W^T, K-step BK = 64; a B page is 128 weight
rows, or 112 for the gu_m*n112 / gu_m128n56 tiles, 64 for m64n64 (see _gemm_kernel.py's
docstring for the wgmma modes "M", "N", "PAGE"). GATE_UP tiles load the gate and the up rows of
the same output columns: 128 (112) in two B pages (bn = 128 / 112), or 64 (56) in one
(gu_m128n64: 64 gate rows then 64 up rows, bn = 64).

M class: M = the step's token rows (the megakernel compiles one variant per class and picks it from
the step's token count, `Megakernel(gemm_m=...)`); LM_HEAD's rows are sequences, and its M may be
taken as either the token count or the sequence count: the planner keeps LM_HEAD row tiles within
the smaller class's BM, which fits both (BM never shrinks as M grows).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mk.ir import Op

BK = 64                 # K per stage (one SW128 atom of bf16): K must be a multiple
B_ROWS = 128            # weight rows per B page
COL_ALIGN = 8           # col0 / cols multiple of 8 (16-byte vectors of bf16)
GPU_HEAD_DIM = 128      # QKV_ROPE: RoPE pairs (c, c + 64) in one wgmma chain of N = 128
NORM_MAX_HIDDEN = 8192  # RMSNORM: 256 consumer threads x 4 vectors of 8 columns per row


@dataclass(frozen=True)
class TileShape:
    """One tile shape (the device-side TileConfig of _gemm_kernel.py extends this)."""

    name: str
    bm: int             # token rows per tile: 64 or 128
    nb: int             # B pages per stage: 1 or 2
    wn: int             # wgmma N per chain: 64 or 128 (56 / 112 on 112-row B pages)
    wg: str             # "M", "N" or "PAGE"
    gate_up: bool = False   # B pages are (gate, up) of the same output columns
    # weight rows per B page: 128, or 112 for the gate/up tiles of 112 / 56 output columns
    # (GATE_UP's 3584 columns per rank at 70B TP8 in 32 / 64 tiles per token block where 128 /
    # 64 columns make 28 / 56: 128 units for 132 SMs at B <= 64 (x 4 splits), 256 and 512
    # instead of 112)
    b_rows: int = B_ROWS

    @property
    def bn(self) -> int:
        """Output columns of a tile (gate_up: NB = 2 pages hold the gate and the up rows of
        b_rows columns, NB = 1 page the gate and the up rows of b_rows / 2 columns)."""
        if self.gate_up:
            return self.b_rows * self.nb // 2
        return self.b_rows * self.nb


# name -> shape; the table below picks one per (opcode, M class)
TILE_SHAPES = {
    "m128n256": TileShape("m128n256", 128, 2, 128, "M"),
    "m128n128": TileShape("m128n128", 128, 1, 128, "M"),
    "m64n256": TileShape("m64n256", 64, 2, 128, "PAGE"),
    "m64n128": TileShape("m64n128", 64, 1, 64, "N"),
    # half of m64n128 (64-row B pages, m64n32 per warpgroup): at M <= 64 O_PROJ / DOWN make 128
    # whole tiles of 8192 columns for 132 SMs, so every SM streams weights without a split-K
    # reduce phase (the M <= 64 class's since session 64)
    "m64n64": TileShape("m64n64", 64, 1, 32, "N", b_rows=64),
    # the same 64-row B page under BM = 128 (m64n64 per warpgroup, "M" mode): 128 whole O_PROJ
    # / DOWN tiles per 128-row block (session 64; the 65..128-token class's since session 65)
    "m128n64": TileShape("m128n64", 128, 1, 64, "M", b_rows=64),
    "gu_m128": TileShape("gu_m128", 128, 2, 128, "M", gate_up=True),
    "gu_m64": TileShape("gu_m64", 64, 2, 64, "N", gate_up=True),
    # 64 output columns: one B page of 64 gate + 64 up rows, twice the tiles of gu_m128
    "gu_m128n64": TileShape("gu_m128n64", 128, 1, 128, "M", gate_up=True),
    # 112-row B pages (wgmma N = 112): gu_m128's and gu_m128n64's shapes for 112 / 56 output
    # columns (built in session 19; the defaults of the 1024 / 256 classes since session 20)
    "gu_m128n112": TileShape("gu_m128n112", 128, 2, 112, "M", gate_up=True, b_rows=112),
    "gu_m128n56": TileShape("gu_m128n56", 128, 1, 112, "M", gate_up=True, b_rows=112),
    # gu_m64's shape on 112-row pages (each warpgroup 56 of the 112 columns): at 70B TP8 and
    # B <= 64 GATE_UP's 32 tiles split 4 ways stream its weights on 128 SMs instead of 112 (the
    # default of the 64 class since session 20)
    "gu_m64n112": TileShape("gu_m64n112", 64, 2, 56, "N", gate_up=True, b_rows=112),
}

# Shape classes: M (token rows of the step, or sequences for LM_HEAD) -> tile per opcode.
# Rationale (one Llama-70B TP8 rank, 132 SMs): at M >= 1024 the GEMMs are compute-bound and the
# 128 x 256 tile (2 warpgroups x m64n256 worth of wgmma, 3 pages per stage, 4 stages) has the best
# smem-bandwidth/FLOP ratio; narrow N (QKV's 1280) and fp32 logits use 128 x 128 (more tiles, and
# 4 staging pages for fp32). At M <= 64 the GEMMs are weight-bandwidth bound: BM = 64 halves the
# wasted A rows, BN = 128 doubles the tile count so every SM streams weights. At 64 < M <= 256
# each SM re-reads the activations from L2 once per tile, so BM = 128 halves that traffic: measured
# on the H200 (session 7, bench/results/tiles_2026-11-29_s7.json), decode B=128 22.04 -> 19.76 ms
# and B=256 33.99 -> 29.33 ms against BM = 64 there.
TILE_TABLE = {
    # op:            (M <= 64,    M <= 128,    M <= 256,    M <= 1024,   M > 1024)
    # O_PROJ / DOWN at 64 < M <= 256 (128 < M <= 256 since session 65, below) on m128n128: at
    # B=256 m128n256 made 64 tiles of ~50 us (DOWN) for 132 SMs, a phase of its own under the
    # op-major queue; m128n128 makes 128.
    # 70B TP8 decode ctx 1024, H200, session 18 (bench/results/planab_{base,od}_2026-11-30_s18):
    # B=256 17.884 -> 15.528 ms (-13.2%); under the interleaved queue (session 16) it was +1.7%.
    # Splitting m128n256 along K instead lost (DOWN +1.0%, O and DOWN +2.3%: the reduce hop).
    # At M <= 64 on m64n64 since session 64 (128 whole tiles where m64n128 made 64, split in two
    # with a SPLITK_REDUCE each; whole writers of h also let norm_fold=4's ROW_PART replace the
    # RMSNORM phases): 70B TP8 decode ctx 1024, H100, B=1 / 16 / 64 8.553 -> 8.295 / 8.722 ->
    # 8.594 / 9.751 -> 9.398 ms (-3.0% / -1.5% / -3.6%); bench/gemm.py M=64 O_PROJ 18.5 -> 14.5
    # us, DOWN 32.2 -> 28.4 (bench/results/od64_*_839263e_2026-12-07_s64_h100*); the two-layer
    # checks, racecheck, memcheck and synccheck clean
    # At 64 < M <= 128 on m128n64 since session 65 (its own class: 128 whole tiles a row block
    # where m128n128 made 64, split in two with a reduce, and ROW_PART replaces the RMSNORM
    # phases as at M <= 64): 70B TP8 decode ctx 1024, H100, B=96 / 128 10.348 -> 9.858 / 11.206
    # -> 10.475 ms (-4.7% / -6.5%), bench/gemm.py M=128 O_PROJ 23.5 -> 15.3 us, DOWN 37.1 ->
    # 29.3; at B=192 / 256 it lost (+10.9% / +10.2%: 256 tiles, two waves), so 129..256 keep
    # m128n128 (bench/results/om128_*_eca0b14_2026-12-07_s65_h100*)
    Op.O_PROJ: ("m64n64", "m128n64", "m128n128", "m128n256", "m128n256"),
    Op.DOWN: ("m64n64", "m128n64", "m128n128", "m128n256", "m128n256"),
    # GATE_UP at 64 < M <= 256 on 64-column tiles (gu_m128n64): at B=256 gu_m128 made 56 tiles,
    # split in two by the planner with a SPLITK_REDUCE per tile; gu_m128n64 makes 112 whole ones
    # (no reduce). 70B TP8 decode ctx 1024, H200, session 16 (bench/results/tiles256_*,
    # gutiles_*_2026-11-30_s16): B=128 15.49 -> 14.82 ms, B=192 19.28 -> 18.88, B=256 19.57 ->
    # 18.19; its GPU tests, the two-layer checks, racecheck and memcheck clean. In the 1024 class
    # it was the tile in session 16 (B=1024 -2.9% under the interleaved queue), but with the
    # op-major queue (session 17), where a layer's GATE_UP tiles run on all SMs at once,
    # gu_m128's two B pages per A page (a third less L2 traffic per flop) win: B=512 28.65 ->
    # 27.49 ms (-4.1%), B=1024 52.02 -> 49.27 (-5.3%) (gutiles_*_2026-11-30_s17). Since session
    # 20 the classes up to 1024 run those shapes on 112-row B pages (112 / 56 output columns: 32 /
    # 64 / 32 tiles per token block of 3584 columns where 128 / 64 made 28 / 56 / 28, so 128 units
    # fill 132 SMs instead of 112). 70B TP8 decode ctx 1024, H200, every other default as it was
    # (bench/results/gutiles112_*_2026-12-01_s20): B=1 / 16 / 64 -0.4% / +0.0% / -0.2%, B=256 /
    # 512 / 1024 -0.5% / -2.3% / -3.0%; its GPU tests, the two-layer checks (never / auto, a
    # 478-token step), racecheck and memcheck clean. Above 1024 gu_m128 stays (not timed there)
    # At M <= 64 on gu_m128n56 since session 71 (64 tiles split in two where gu_m64n112 made 32
    # split in four; reduces in 32-row slices, PlanConfig.gate_up_reduce_rows, so 128 a layer at
    # B=64 as before, where 16-row slices made 256 and lost 0.5%): 70B TP8 decode ctx 1024,
    # H100, B=1 / 16 / 64 8.25 / 8.54 / 9.38 -> 8.17 / 8.44 / 9.31 ms (-1.0% / -1.2% / -0.7%;
    # B=64 -1.6% in another run) (bench/results/decab*_4b2b785_2026-12-08_s71_h100*)
    Op.GATE_UP: ("gu_m128n56", "gu_m128n56", "gu_m128n56", "gu_m128n112", "gu_m128"),
    # LM_HEAD at 64 < M <= 256 on m128n128 since session 20 (half the tiles, each re-reading half
    # as many weight bytes per flop): bench/gemm.py at M=256 188.4 -> 131.6 us, 1.55 -> 1.09 of
    # cuBLAS + epilogue (bench/results/gemm_lm128_2026-12-01_s20; poisoned checks at M=200 / 256)
    # Above 256 on m128n256 since session 26 (half the tiles again; each re-reads its A rows
    # half as often, and its 8 float32 epilogue pages leave the ring's next stage free):
    # bench/gemm_profile.py at M=1024 453.4 -> 406.0 us, M=4096 1758.4 -> 1606.1 us
    # (bench/results/f32store_2026-12-02_s26.json; poisoned checks at 1024 / 4096), and at
    # 64 < M <= 256 since session 27 (126 tiles for 132 SMs at M=256 instead of 252):
    # bench/gemm_profile.py at M=256 126.0 -> 117.1 us (bench/results/lm256_2026-12-02_s27.json;
    # poisoned checks at 200 / 256)
    Op.LM_HEAD: ("m64n128", "m128n256", "m128n256", "m128n256", "m128n256"),
    # QKV: RoPE pairs (c, c + 64) of a 128-wide head must sit in one thread: wgmma N = 128 per
    # head ("M" or "PAGE" mode). At M <= 64 one head per 128-row tile, not two per 64-row one:
    # 10 tiles split 8 ways instead of 6 split 16 (the same weight bytes per SM, half the
    # partials for QKV's reduce to read): decode B=16 -0.6%, B=64 -1.1%, B=1 -0.1% on the H200
    # (session 14, bench/results/tiles_qkv64_*_2026-11-30_s14.json; m64n256 before)
    Op.QKV_ROPE: ("m128n128", "m128n128", "m128n128", "m128n128", "m128n128"),
}
# 128 splits the old 64 < M <= 256 class for O_PROJ / DOWN's tile (session 65); the other
# opcodes take the same tile in both halves
M_CLASSES = (64, 128, 256, 1024)
CLASS_NAMES = ("64", "128", "256", "1024", "max")  # the classes by their upper bound (max: > 1024)


def table_overrides(text: str, table: dict | None = None) -> dict:
    """TILE_TABLE with entries replaced, from "OP@CLASS=TILE,..." (CLASS one of CLASS_NAMES),
    e.g. "GATE_UP@256=gu_m128,DOWN@256=m128n256": the experiment knob MK_TILES (read once at
    import, so the planner and the compiled kernels of a process agree). Raises ValueError on an
    unknown opcode, class or tile, or a tile the opcode's body cannot run."""
    out = {op: list(v) for op, v in (TILE_TABLE if table is None else table).items()}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            lhs, tile = part.split("=")
            name, cls = lhs.split("@")
        except ValueError:
            raise ValueError(f"MK_TILES entry {part!r}: expected OP@CLASS=TILE") from None
        try:
            op = Op[name.strip()]
        except KeyError:
            raise ValueError(f"MK_TILES entry {part!r}: {name!r} is not a GEMM opcode "
                             f"({', '.join(o.name for o in out)})") from None
        if op not in out:
            raise ValueError(f"MK_TILES entry {part!r}: {name!r} has no tile table row")
        if cls.strip() not in CLASS_NAMES:
            raise ValueError(f"MK_TILES entry {part!r}: class {cls!r} is not one of {CLASS_NAMES}")
        shape = TILE_SHAPES.get(tile.strip())
        if shape is None:
            raise ValueError(f"MK_TILES entry {part!r}: unknown tile {tile!r} "
                             f"({', '.join(TILE_SHAPES)})")
        if shape.gate_up != (op == Op.GATE_UP):
            raise ValueError(f"MK_TILES entry {part!r}: GATE_UP takes exactly the gate/up tiles")
        if op == Op.QKV_ROPE and shape.wn != GPU_HEAD_DIM:
            raise ValueError(f"MK_TILES entry {part!r}: QKV_ROPE needs wgmma N = {GPU_HEAD_DIM} "
                             "(RoPE pairs of a head in one chain)")
        out[op][CLASS_NAMES.index(cls.strip())] = shape.name
    return {op: tuple(v) for op, v in out.items()}


TILE_TABLE = table_overrides(os.environ.get("MK_TILES", ""))
GEMM_TILE_OPS = tuple(TILE_TABLE)
# the token-row GEMMs (LM_HEAD's rows are sequences)
TOKEN_GEMM_OPS = (Op.QKV_ROPE, Op.O_PROJ, Op.GATE_UP, Op.DOWN)


def m_class(m: int) -> int:
    """Index of M's class: 0 (M <= 64), 1 (<= 128), 2 (<= 256), 3 (<= 1024), 4 (> 1024)."""
    return sum(1 for b in M_CLASSES if m > b)


def class_fewest_tokens(m: int) -> int:
    """The smallest step (token rows) of M's class: 1, 65, 129, 257 or 1025."""
    return ((0,) + M_CLASSES)[m_class(m)] + 1


def class_largest_tokens(m: int, max_tokens: int) -> int:
    """The largest step (token rows) of M's class: 64, 128, 256, 1024 or max_tokens (the compiled
    maximum, for the class above 1024)."""
    c = m_class(m)
    return M_CLASSES[c] if c < len(M_CLASSES) else max_tokens


def tile_name(op, m: int) -> str:
    return TILE_TABLE[Op(op)][m_class(m)]


def tile_shape(op, m: int) -> TileShape:
    return TILE_SHAPES[tile_name(op, m)]


# Planner defaults ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTiles:
    """The tiling of one step (what mk.plan emits; StepPlan.tiles)."""

    token_block: int    # rows per token block (rows family, QKV / O / GATE_UP / DOWN tiles)
    lm_block: int       # sequences per LM_HEAD row tile
    qkv: int            # QKV_ROPE output columns per tile (whole heads)
    o: int              # O_PROJ output columns per tile
    mlp: int            # GATE_UP output columns per tile (each computes gate and up)
    down: int           # DOWN output columns per tile
    lm: int             # LM_HEAD vocab columns per tile
    m: int = 0          # the token count the defaults were taken for (0: every value explicit)


def default_token_block(m: int, cap: int | None = None) -> int:
    """Rows per token block at M = m: the smallest BM of the class's token GEMMs (so every GEMM
    row tile fits its tile), capped by `cap` (KernelConfig.token_block)."""
    c = m_class(m)
    b = min(TILE_SHAPES[TILE_TABLE[op][c]].bm for op in TOKEN_GEMM_OPS)
    return b if cap is None else min(b, cap)


def default_qkv_tile(m: int, head_dim: int) -> int:
    """QKV columns per tile: the table's bn, rounded down to whole heads (at least one head)."""
    bn = tile_shape(Op.QKV_ROPE, m).bn
    return max(1, bn // head_dim) * head_dim


def step_tiles(m: int, seqs: int, head_dim: int, token_block_cap: int | None = None, *,
               token_block: int | None = None, lm_block: int | None = None,
               qkv: int | None = None, o: int | None = None, mlp: int | None = None,
               down: int | None = None, lm: int | None = None) -> StepTiles:
    """The tiling of a step of m token rows and `seqs` sequences: every value not given comes from
    the table for m's class (LM_HEAD's row tile: the smaller BM of the classes of m and seqs)."""
    tb = default_token_block(m, token_block_cap) if token_block is None else token_block
    if lm_block is None:
        lm_block = min(tb, tile_shape(Op.LM_HEAD, min(m, seqs)).bm)
    return StepTiles(
        token_block=tb, lm_block=lm_block,
        qkv=default_qkv_tile(m, head_dim) if qkv is None else qkv,
        o=tile_shape(Op.O_PROJ, m).bn if o is None else o,
        mlp=tile_shape(Op.GATE_UP, m).bn if mlp is None else mlp,
        down=tile_shape(Op.DOWN, m).bn if down is None else down,
        lm=tile_shape(Op.LM_HEAD, m).bn if lm is None else lm,
        m=m)


# The GPU bodies' tile predicate -------------------------------------------------------------------
def gemm_tile_error(name: str, cfg: TileShape, row0, rows, col0, cols, K, head_dim=None,
                    sec_col0=None, k0=None) -> str | None:
    """Why GEMM instructions of opcode `name` cannot run as tiles `cfg` (None: they can).

    Arguments are equal-length integer arrays (numpy or torch) of the instructions' words. The
    bounds against the operands (K, rows and columns within the tensors) are the caller's
    (mk.megakernel.check_plan). QKV_ROPE: head_dim / sec_col0 words, tiles of whole heads.
    Split-K tiles: K is the slice width and k0 (word A_K0) its first column, both multiples of BK."""
    if ((K % BK) != 0).any() or (K <= 0).any():
        return f"{name} K must be a positive multiple of {BK}"
    if k0 is not None and (((k0 % BK) != 0).any() or (k0 < 0).any()):
        return f"{name} split-K slices must start at a non-negative multiple of {BK} (k0)"
    if ((col0 % COL_ALIGN) != 0).any() or ((cols % COL_ALIGN) != 0).any() or (cols <= 0).any() \
            or (cols > cfg.bn).any() or (col0 < 0).any():
        return (f"{name} tiles need col0 and cols multiples of {COL_ALIGN} and 0 < cols <= "
                f"{cfg.bn} (tile {cfg.name})")
    if (rows <= 0).any() or (rows > cfg.bm).any() or (row0 < 0).any():
        return f"{name} tiles need 0 < rows <= {cfg.bm} (tile {cfg.name})"
    if head_dim is not None:
        if (head_dim != GPU_HEAD_DIM).any():
            return (f"{name} needs head_dim {GPU_HEAD_DIM} (RoPE pairs in one wgmma chain)")
        if sec_col0 is not None and ((((col0 - sec_col0) % head_dim) != 0).any()
                                     or ((cols % head_dim) != 0).any()):
            return f"{name} tiles must hold whole heads of one section"
    return None
