"""Helpers shared by the model's instruction families (not a family: names starting with _ are not
auto-loaded by the registry).

Step metadata: every instruction that needs per-token or per-sequence data (token ids, positions,
KV slots, page tables, last rows) reads it from the step's int32 metadata buffer (mk.plan.StepMeta),
whose header words are fixed here so that the families, the planner and the megakernel agree.
"""

from __future__ import annotations

from mk.ir import ARG0, W_OPCODE, Instruction, Op

# Step metadata header (int32 words at the start of the metadata buffer) ----------------------------
M_NUM_TOKENS = 0        # T: token rows of the step
M_NUM_SEQS = 1          # S: sequences of the step
M_OFF_TOKENS = 2        # tokens[T]       token id of each row
M_OFF_POS = 3           # positions[T]    position of each row in its sequence
M_OFF_SLOT = 4          # kv_slot[T]      page * page_size + position % page_size (KV append slot)
M_OFF_SEQ = 5           # seqs[S, SEQ_WORDS]
M_OFF_LAST = 6          # last_rows[S]    row of each sequence's last new token
M_OFF_PAGES = 7         # page tables, concatenated (seq s's table at seqs[s].page_off)
M_PAGE_SIZE = 8
M_KV_LAYER_STRIDE = 9   # rows of one layer in K_CACHE / V_CACHE (= num_pages * page_size)
M_WORDS = 10            # total words of the metadata buffer
META_HEADER = 16

# seqs[s] words
SEQ_ROW0 = 0            # first token row of the sequence in the step
SEQ_ROWS = 1            # its new tokens
SEQ_START_POS = 2       # position of its first new token
SEQ_PAGE_OFF = 3        # absolute word offset of its page table in the metadata buffer
SEQ_WORDS = 4


# Split-K words: the same positions in every GEMM-like opcode (QKV_ROPE, O_PROJ, GATE_UP, DOWN;
# mk/instructions/splitk.py). A split tile computes the float32 partial of K columns [k0, k0+K) (its
# K word is the slice width) and stores it to SPLITK rows j * stride + row, with no epilogue.
A_NSPLIT = ARG0 + 10    # splits of this tile's K range; 0 or 1: not split (every unsplit tile: 0)
A_SPLIT_J = ARG0 + 11   # split index j (0 .. nsplit-1)
A_K0 = ARG0 + 12        # first K column of the slice
A_SPLIT_ROW = ARG0 + 13 # SPLITK row stride between splits
# An unsplit QKV_ROPE / GATE_UP tile under PlanConfig.norm_fold=2 (the norm folded into it): the
# tile multiplies the residual rows h (its src) by the norm-weight-folded weights and scales each
# output row by ROW_SCALE[row] (the row-scale RMSNORM's rsqrt(mean(h^2) + eps)) before the
# rounding, y = bf16(acc * r), as a row-scaled SPLITK_REDUCE does. It reads ROW_SCALE only in its
# epilogue, after its epilogue wait: counter A_EPI_WAIT - 1 at target A_EPI_TARGET (0: no row
# scale, no epilogue wait). Its mainloop waits only for its W_WAIT words (h's writer), so the norm
# runs beside it instead of before it. Queue order puts the norm earlier, so the wait, which holds
# the tile's SM, always has a runnable producer (mk.verify checks both orders).
A_EPI_WAIT = ARG0 + 8
A_EPI_TARGET = ARG0 + 9
# PlanConfig.norm_fold=3: A_EPI_WAIT = SELF_SCALE marks an unsplit QKV_ROPE / GATE_UP tile that
# computes its rows' statistic r = rsqrt(mean(h^2) + eps) itself, from the h rows its mainloop
# streams (all K = hidden columns of them pass through its A pages), and scales y = bf16(acc * r)
# as under norm_fold=2: no row-scale RMSNORM, no ROW_SCALE, no epilogue wait.
SELF_SCALE = -1
# PlanConfig.norm_fold=4: the rows' statistic from the tiles that write h. An unsplit O_PROJ /
# DOWN tile with the RESIDUAL epilogue, or an EMBED tile (layer 0's h), whose A_ROW_PART word is
# 1 + b also writes, for each of its rows, the sum of squares of its h values (bf16, as stored)
# over each ROW_PART_COLS columns c .. c + 63 into ROW_PART[row, b + c / ROW_PART_COLS]: b is the
# first column of a set of G = H / ROW_PART_COLS (ROW_PART_ATTN for DOWN / EMBED, whose h the
# next attention norm reads, ROW_PART_MLP for O_PROJ). An unsplit QKV_ROPE / GATE_UP tile whose
# A_EPI_WAIT is ROW_PARTS scales its rows by rsqrt(sum of ROW_PART[row, b : b + K / 64] / K +
# eps), b = its A_EPI_TARGET and K its K word (= H), as norm_fold=2 / 3 tiles do: no RMSNORM, no
# epilogue wait, and no statistic pass over its A pages (norm_fold=3's cost). The sums are
# written by the very tiles whose h rows the tile's A operand waits for, and rewritten only
# after every reader of those rows (the residual stream's own order; mk.verify checks it).
A_ROW_PART = ARG0 + 6
ROW_PARTS = -2
ROW_PART_COLS = 64
ROW_PART_ATTN, ROW_PART_MLP = 0, 1     # the sets, in this order (set s's first column: s * G)
ROW_PART_SETS = 2
SPLIT_ARG_NAMES = {A_NSPLIT - ARG0: "nsplit", A_SPLIT_J - ARG0: "j", A_K0 - ARG0: "k0",
                   A_SPLIT_ROW - ARG0: "split_row", A_EPI_WAIT - ARG0: "epi_wait",
                   A_EPI_TARGET - ARG0: "epi_target", A_ROW_PART - ARG0: "row_part"}


# the opcodes whose rows may be scaled by ROW_SCALE (PlanConfig.norm_fold): their SPLITK_REDUCE
# (mk/instructions/splitk.py) or, unsplit, the tile's own epilogue (A_EPI_WAIT)
ROW_SCALED = (Op.QKV_ROPE, Op.GATE_UP)
_ROW_SCALED_IDS = frozenset(int(o) for o in ROW_SCALED)
# the opcodes that may write ROW_PART (A_ROW_PART, PlanConfig.norm_fold=4)
ROW_PART_WRITERS = (Op.O_PROJ, Op.DOWN, Op.EMBED)
_ROW_PART_WRITER_IDS = frozenset(int(o) for o in ROW_PART_WRITERS)


def epilogue_wait(instr: Instruction) -> tuple[int, int] | None:
    """(counter, target) of an unsplit GEMM tile's epilogue wait (A_EPI_WAIT), else None."""
    if instr.opcode not in _ROW_SCALED_IDS:
        return None
    c = instr.args[A_EPI_WAIT - ARG0]
    return (c - 1, instr.args[A_EPI_TARGET - ARG0]) if c > 0 else None


def self_scaled(instr: Instruction) -> bool:
    """An unsplit QKV_ROPE / GATE_UP tile that scales its rows by their own statistic
    (A_EPI_WAIT = SELF_SCALE; PlanConfig.norm_fold=3)."""
    return (instr.opcode in _ROW_SCALED_IDS
            and instr.args[A_EPI_WAIT - ARG0] == SELF_SCALE)


def row_part_groups(width: int) -> int:
    """G: ROW_PART slots of one set for rows of `width` (the hidden size) columns."""
    return -(-width // ROW_PART_COLS)


def row_part_ld(hidden):
    """ROW_PART's row length: both sets' columns for rows of `hidden` columns (Python or DSL
    integers)."""
    return ROW_PART_SETS * ((hidden + (ROW_PART_COLS - 1)) // ROW_PART_COLS)


def row_part_offset(numel, tokens, ld):
    """ROW_PART's first float in the GPU's SPLITK allocation of numel floats (Python or DSL
    integers; mk.instructions._rows_kernel.row_part_addr): (numel - tokens), the start of
    ROW_SCALE's floats, rounded down to a multiple of 4, less tokens * ld (mk.plan.splitk_shape
    reserves the rows, row_part_rows; ld a multiple of 4 keeps every row 16-byte aligned)."""
    return ((numel - tokens) & ~3) - tokens * ld


def row_part_base(instr: Instruction) -> int | None:
    """The first ROW_PART column of the set an h-writing tile (O_PROJ / DOWN / EMBED) also
    writes its rows' partial sums of squares into (A_ROW_PART - 1), else None."""
    if instr.opcode not in _ROW_PART_WRITER_IDS:
        return None
    v = instr.args[A_ROW_PART - ARG0]
    return v - 1 if v > 0 else None


def row_part_scaled(instr: Instruction) -> int | None:
    """The first ROW_PART column of the set an unsplit QKV_ROPE / GATE_UP tile scales its rows
    from (A_EPI_WAIT = ROW_PARTS, the column in A_EPI_TARGET; PlanConfig.norm_fold=4), else
    None."""
    if instr.opcode not in _ROW_SCALED_IDS or instr.args[A_EPI_WAIT - ARG0] != ROW_PARTS:
        return None
    return instr.args[A_EPI_TARGET - ARG0]


def epilogue_wait_words(w) -> tuple[int, int] | None:
    """epilogue_wait of an encoded instruction's words (a row of a stream)."""
    if int(w[W_OPCODE]) not in _ROW_SCALED_IDS:
        return None
    c = int(w[A_EPI_WAIT])
    return (c - 1, int(w[A_EPI_TARGET])) if c > 0 else None


def all_waits(instr: Instruction) -> list[tuple[int, int]]:
    """Every wait of an instruction: its W_WAIT words' and its epilogue wait."""
    e = epilogue_wait(instr)
    return list(instr.waits) + ([e] if e is not None else [])


def is_split(instr: Instruction) -> bool:
    return instr.args[A_NSPLIT - ARG0] >= 2


def arg(instr: Instruction, word: int) -> int:
    return instr.args[word - ARG0]


def rows_of(instr: Instruction) -> tuple[int, int]:
    return instr.row0, instr.row0 + instr.rows


def cols_of(instr: Instruction) -> tuple[int, int]:
    return instr.col0, instr.col0 + instr.cols


def runs(values) -> list[tuple[int, int]]:
    """Sorted integers -> maximal runs [a, b) of consecutive values (for compact Regions)."""
    out: list[tuple[int, int]] = []
    for v in sorted(int(x) for x in values):
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        elif not out or out[-1][1] < v:
            out.append((v, v + 1))
    return out


def need_meta(meta, op) -> None:
    if meta is None:
        raise ValueError(f"accesses of {op!r} depend on the step metadata: pass meta=plan.meta "
                         f"(or use mk.plan.StepPlan.accesses)")
