"""The planner: one forward step's batch -> the int32 instruction stream, counters and metadata.

    plan = plan_step(batch, model, parallel, kernel, PlanConfig())
    plan.instrs          int32 [N, 32] for rank parallel.rank (mk.ir format)
    plan.meta            StepMeta: the step's int32 metadata buffer (token ids, positions, KV slots,
                         sequence table, last rows, page tables), the same on every rank
    plan.targets         int32 [num_counters]: each counter's value once the step is done
    plan.for_rank(r)     the stream of another rank (only TP_REDUCE's column slice differs)

Tiling (PlanConfig.step_tiles, StepPlan.tiles): by default from the GEMM tile table (mk.tiles) for
the step's M class (token count): GEMM column tiles = the tile's BN (QKV: whole heads), token block
B = the smallest BM of the class's token GEMMs, capped by KernelConfig.token_block; LM_HEAD row
tiles of min(B, LM_HEAD's BM) sequences. Explicit PlanConfig values override.

Per layer (token block b = rows [b*B, (b+1)*B), B = the step's token block):
    RMSNORM(attn, b) -> QKV_ROPE tiles (b x head-aligned column tiles of one q/k/v section)
    -> ATTENTION per segment (sequence s's rows in block b) x KV-head group x KV split
       [-> ATTN_REDUCE per split segment]  -> O_PROJ tiles [-> TP_REDUCE]
    -> RMSNORM(mlp, b) -> GATE_UP tiles -> DOWN tiles [-> TP_REDUCE]
then LM_NORM (per block holding last rows) -> LM_HEAD tiles (sequence row tiles x vocab tiles).
Before layer 0, EMBED tiles (on the DOWN tile grid) [-> TP_REDUCE without residual].
Split-K (TP 1): a split GEMM tile's SPLITK_REDUCE follows its split tiles, or is folded into the
norm after it (PlanConfig.fold_o_reduce: O_PROJ's into the MLP norm; fold_down_reduce: DOWN's
into the next layer's attention norm, the last layer's DOWN reduced before LM_NORM).

Prefill chunks spanning several blocks: attention of block b needs the K/V of the sequence's rows
in every earlier block of this step. A chain of NOOP joins per sequence carries that: JOIN(s, b)
waits QKV(b) and JOIN(s, b-1); ATTENTION(s, b) waits QKV(b) and JOIN(s, b-1). (Two waits each.)

Tensor parallelism: reduce-scatter + all-gather fused into epilogues.
    O_PROJ / DOWN (and EMBED) tiles on rank p compute a partial sum of (token block b, column tile
    c); column tiles never straddle the ranks' H/n slices; the tile of rank q's slice is stored
    into rank q's RECV rows [p*T + rows] (SCATTER epilogue) and signals rank q's counter RS(b)
    (scope PEER). Rank q's TP_REDUCE(b) waits RS(b) = n x (tiles per slice), sums the n partials
    in the fixed rank order 0..n-1 (deterministic), adds the residual, and writes HIDDEN[rows,
    slice q] on every rank, signalling HID(b) on every rank (scope ALL; target n). The next
    RMSNORM(b) waits HID(b) = n. At TP 1 the epilogue adds the residual in place (RESIDUAL) and
    HID(b)'s target is the number of column tiles. Logits stay vocab-sharded in each rank's LOGITS;
    the host (VM / engine) gathers them.
    Traffic per layer and token: 2 x (n-1)/n x H partials out, (n-1)/n x H gathered back per
    reduce, the same bytes as a ring all-reduce, with no extra pass over HBM.

Split-K (PlanConfig.split_k; default 1 = never): in a step of at most splitk_max_tokens rows (or
the op's own cap, SPLITK_OP_CAPS, when set), an output tile of QKV_ROPE / O_PROJ / GATE_UP / DOWN
may be cut along K into nsplit split tiles (same waits; K slices of multiples of splitk_align;
float32 partials into SPLITK rows j * T + row, T the step's token count) that each signal the
tile's SK counter, and one SPLITK_REDUCE (waits SK = nsplit, sends the unsplit tile's signal, so
every consumer's wait is unchanged). Auto (0): per op, the largest power of two with output tiles x
nsplit <= num_sms (mk/instructions/splitk.py). The reduces are queued half a stage after their
split tiles (REDUCE_STAGE_OFFSET), in every policy.

Counters: one int32 array per rank, zero at the start of a step (the megakernel may instead keep
them monotonic and add step x target). Layout, relative to a layer's counter block of CPL
counters (block 0 is the prelude "layer -1" of EMBED; layer l uses block l+1):
    NA[b] attn norm done, QKV[b], ATTN[b], ORS[b], HA[b], NM[b], GU[b], DRS[b], HM[b],
    JOIN[segment], SPLIT[segment], SK[split output tile]; then LMN and DONE after the last block. Targets are exact: the
    number of signals the counter receives in the step (see StepPlan.targets, checked by the VM).

Queue order (PlanConfig.policy), always a topological order (every wait's producers come earlier
in every rank's queue, and the ranks' queues have the same structure):
    "op_major"     per layer: all norms, all QKV tiles, all attention, all O tiles, ... (the
                   default since session 17: 70B TP8 decode B=1024 60.591 -> 51.389 ms, -15.2%,
                   B=256 -1.7% against interleave, bench/E2E_NOTES.md; at one token block, i.e.
                   up to 128 tokens, the three orders are the same queue)
                   With raster_blocks > 1 a GEMM's tiles of each run of that many token
                   blocks go column tile by column tile (the default: 8).
    "block_major"  per layer: everything of block 0, then block 1, ...
    "interleave"   per layer, a software pipeline: instruction (stage s, block b) at time b + s;
                   within a time slice the stages are interleaved proportionally, so memory-bound
                   work (attention, norms, reduces) of one block sits between compute-bound GEMM
                   tiles of others.
Speed: one layer's template is built with numpy (vectorised over blocks, tiles, segments) and
replicated over layers by adding layer x CPL to its counter ids.
"""

from __future__ import annotations

import functools
import math
from itertools import chain
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from mk import tiles
from mk.batch import StepBatch
from mk.config import KernelConfig, ModelConfig, ParallelConfig
from mk.instructions import _common as mc
from mk.instructions import attention as at
from mk.instructions import comm as cm
from mk.instructions import embed as em
from mk.instructions import lm as lmn
from mk.instructions import matmul as mm
from mk.instructions import prefetch as pf
from mk.instructions import qkv as qk
from mk.instructions import rows as rw
from mk.instructions import splitk as sk
from mk.instructions.base import Accesses, Buf, NormWeight, family_of
from mk.ir import (INSTR_WORDS, MAX_WAITS, NO_COUNTER, W_COL0, W_COLS, W_LAYER, W_OPCODE, W_ROW0,
                   W_ROWS, W_SIGNAL, W_SIGNAL_COUNT, W_SIGNAL_RANK, W_SIGNAL_SCOPE, W_WAIT0,
                   Instruction, Op, SignalScope)

POLICIES = ("op_major", "block_major", "interleave")
COUNTER_WORDS = [W_WAIT0 + 2 * i for i in range(MAX_WAITS)] + [W_SIGNAL]


TILE_FIELDS = ("qkv_tile", "o_tile", "mlp_tile", "down_tile", "lm_tile", "token_block")


# the PlanConfig field of each split-K op's own token cap
SPLITK_OP_CAPS = {Op.QKV_ROPE: "splitk_qkv_max_tokens", Op.O_PROJ: "splitk_o_max_tokens",
                  Op.GATE_UP: "splitk_gate_up_max_tokens", Op.DOWN: "splitk_down_max_tokens"}


@dataclass(frozen=True)
class PlanConfig:
    """How a step is tiled and queued.

    Tile widths and the token block left at None come from the GEMM tile table (mk.tiles) for the
    step's M class (its token count), so a default plan is one the GPU bodies accept: column tiles
    = the tile's BN (QKV: whole heads), token blocks <= every token GEMM's BM (capped by
    KernelConfig.token_block). Values given here override the table (tests use tiny tiles); they
    are validated once, at the edge (here, and against the model by `validate_for`)."""

    policy: str = "op_major"
    # op_major only: a GEMM's tiles of each run of raster_blocks token blocks are queued column
    # tile by column tile (the blocks' tiles that share a weight slice together, so the SMs that
    # run at once share weights in L2 rather than re-reading all of them from HBM per block);
    # 1: block by block. 70B TP8 decode, H200, session 17 (bench/results/raster*_2026-11-30_s17,
    # same GPU, 1 vs 8): B=256 17.843 -> 17.676 ms (-0.9%), B=1024 48.105 -> 47.844 (-0.5%),
    # B=4096 ctx 256 167.010 -> 150.415 (-9.9%). Up to 64 tokens no change; at 65..128 tokens
    # only LM_HEAD's two 64-row blocks (not timed there)
    raster_blocks: int = 8
    # op_major only: 1 queues a layer's ATTENTION instructions, in a step with prompt chunks
    # (rows > 1), as the chunks first, then the decode units, each longest first by
    # attention.est_cost_ns (ties keep the block order), instead of block by block. Why: in the
    # mixed step (256 decodes at ctx 1024 + a 1024-token prompt) the layer's 128 decode pairs
    # (~48 us each) come first in the queue, the prompt's chunks after them block by block, the
    # longest (1024 keys, ~65 us) last, while the prompt's QKV tiles are the layer's critical
    # path (its chunks wait for all of them): the SMs that would run the long chunks as soon as
    # those end are busy with pairs. bench/schedsim.py with session 56's journal (ATTENTION's
    # time by est_cost_ns): 52.64 -> 51.74 ms (-1.7%); longest first over both kinds (pairs
    # between the chunks) +0.7%. On the GPU (H100, session 56, gpu_next.sh `attnlpt`,
    # bench/results/attnlpt_*_s56*): 46.275 / 46.460 -> 45.282 ms (-2.3%), decode B=1280
    # unchanged; the two-layer checks passed. (Session 55's attn_overlap, QKV / attention /
    # O_PROJ pipelined over token blocks, lost on the GPU: B=4096 +6..10%, the mixed step
    # +3..9%, session 56.) 2: the chunks first in block order (not by cost), then the decode
    # units longest first. Why: with attn_chunk_splits a long prompt's chunks of its last
    # blocks (the most keys) went first and those of its first blocks last, so the reduces and
    # O_PROJ tiles queued right after the attention (block 0's first) waited for the layer's
    # shortest chunks. schedsim (session 58's journals, attention durations by the journaled
    # stream's mean cost): 256 decodes + a 2048-token prompt -5.3%, a 4096-token prompt
    # -0.6%, the 256 + 1024 mixed step unchanged (attn_lpt 0 there: +1.5%). On the GPU (H100,
    # session 59, with attn_chunk_reduce=1, bench/results/planab_l2cr_*_s59_h100*): a
    # 4096-token prompt 139.02 -> 137.01 ms (-1.4%), 256 + 2048 80.10 -> 80.17 (+0.1%; journal
    # +1.3%); interleaved rep by rep with attn_lpt 1 on one kernel (session 61, `launch/bench.py
    # --plan-ab`, bench/results/planpair_*_s61_h100*, median per-rep ratio): the 4096-token
    # prompt 0.992, 256 + 2048 0.989, the 256 + 1024 mixed step 1.002 (p10 / p90 0.97 / 1.07):
    # mk.megakernel_step.DEFAULT_PLAN's since session 61.
    attn_lpt: int = 0
    qkv_tile: int | None = None     # qkv output columns per tile: whole heads (below head_dim: one)
    o_tile: int | None = None       # o_proj output columns per tile (within a rank's H/n slice)
    mlp_tile: int | None = None     # gate/up output columns per tile (of I/n; each computes gate and up)
    down_tile: int | None = None    # down output columns per tile (within a rank's H/n slice)
    lm_tile: int | None = None      # vocab columns per LM_HEAD tile
    token_block: int | None = None  # token rows per block; None: min(table BM, KernelConfig's)
    kv_split: int = 1024        # keys per attention split (a context longer than this is split)
    # > 0: a step whose attention instructions would not fill num_sms SMs cuts its decode
    # segments' keys into smaller splits (one size per step, a multiple of kv_split_min, at least
    # kv_split_min, at most kv_split) so that they do (spread_kv_splits); 0: never. 64 (one key
    # block): 70B TP8 decode at ctx 1024 -4.4% / -4.2% / -3.1% at B=1 / 16 / 32 (H200, session 9,
    # bench/results/split_2026-11-30_s9*)
    kv_split_min: int = 64
    # ... but only when the longest decode context then has at least this many splits: at B=48
    # (3 splits of 384 keys) the spread lost 4.8%, at B=64 (2 of 512) 1.5% (session 9)
    kv_spread_min_splits: int = 4
    attn_kv_heads: int = 1      # KV heads per attention instruction
    # Two decode units (one-row direct segments of one token block and KV group) in one ATTENTION
    # instruction (mode MODE_PAIR): the GPU body gives each consumer warpgroup its own unit, where
    # a single decode unit leaves warpgroup 1 idle (at B=1024 ATTENTION was 35% of the SMs' busy
    # time, one instruction per sequence; bench/ATTENTION_NOTES.md session 15). 0: never; 1
    # (default): when a step's attention instructions outnumber num_sms, just enough pairs (of
    # the closest contexts) that they do not; 2: every pair that can be made. 70B TP8 decode ctx
    # 1024 (H200, session 15, bench/results/pair_*_2026-11-30_s15): B=256 21.13 -> 19.51 ms,
    # B=1024 69.45 -> 64.11 ms (-7.7% each; ATTENTION's SM time -37% at B=1024); checks,
    # racecheck and memcheck of every decode paired clean
    attn_pair: int = 1
    # query rows (tokens) per ATTENTION instruction of a prefill segment (0: the whole segment,
    # up to token_block rows, in one instruction). An instruction runs its M tiles (128 query
    # rows: 128 / (q heads per KV head) tokens each) one after another on one SM, so the last
    # 128-token block of a 1024-token prompt walks 8 tiles x up to 16 key blocks on one SM while
    # the layer's O_PROJ waits for it (the mixed step of launch/bench.py: 1.38 of the peer in
    # session 18, the worst point). Segments longer than this are cut into chunks of this many
    # rows, rounded up to whole M tiles (the GPU body then runs the same tiles as before: the same
    # results), queued longest first, each on an SM of its own. Segments split over KV
    # (contexts over kv_split) are not chunked. 16 (one M tile at 8 q heads per KV head):
    # session 19, 70B TP8, H200 (planab_{base,ch16}_2026-12-01_s19), the mixed step of 256
    # decodes at ctx 1024 + a 1024-token prompt 61.93 -> 50.98 ms (-17.7%; ATTENTION's longest
    # instruction 291 -> 65 us), decode B=1 unchanged
    attn_chunk_rows: int = 16
    # 1: a prefill segment split over KV (a context over kv_split) is cut into attn_chunk_rows
    # chunks too, each split of each chunk one ATTENTION instruction (the split's ATTN_REDUCE
    # then waits for them all; each writes its rows' partials at the segment's slots). 0: a split
    # segment stays whole. Why: a 128-token block of a 4096-token prompt is 4 splits of 1024 keys
    # over 8 M tiles each, ~128 key-block tiles (~0.5 ms at attention.est_cost_ns's rate) on one
    # SM while the block's O_PROJ waits; chunked, each instruction is at most 16 blocks of one M
    # tile, as in the unsplit prompts attn_chunk_rows cut in session 19 (whose first try chunked
    # split segments too: the interpreter failed on a chunk with no key of its split, now o = 0,
    # lse = -inf there as in the GPU body). The megakernel backend's default is 1
    # (mk.megakernel_step.DEFAULT_PLAN, session 58); 0 here keeps the CPU interpreter's plans
    # and older journals' replays (bench/schedsim.py) as they ran.
    attn_chunk_splits: int = 0
    # 1: a split segment cut into chunks (attn_chunk_splits) gets one ATTN_REDUCE per chunk,
    # waiting only for that chunk's splits, instead of one for the segment waiting for all of
    # them; the partial rows are laid out chunk by chunk (a chunk's splits' rows contiguous at
    # seg_slot + first row x splits), so each chunk's reduce is an ordinary one of its rows (the
    # GPU body unchanged). 0: one reduce per segment. Why: with attn_chunk_splits the segment's
    # reduce (~94 us for a 128-token block of 4 splits, one SM) waits for its slowest chunk and
    # the block's O_PROJ for it; ATTN_REDUCE held 6.8 ms of a 4096-token prompt step's critical
    # path and 6.2 ms of 256 decodes + a 2048-token prompt (session 58's journals). On the GPU
    # (H100, session 59): a 4096-token prompt step -2.0%, 256 + 2048 -1.0% (journals -3.8% /
    # -1.9%); the megakernel backend's default (DEFAULT_PLAN), 0 here as attn_chunk_splits.
    attn_chunk_reduce: int = 0
    # token rows per RMSNORM / LM_NORM instruction: a block's norm is cut into row groups that run
    # on as many SMs (one instruction per 64-row block ran 100 us on one SM at 70B TP8 shapes while
    # the rest of the GPU waited on it); 8 = one page row group of the rows body
    norm_rows: int = 8
    # ... and at most small_norm_rows in steps of at most small_norm_max_tokens tokens (0: never):
    # there the two norms of a layer are on its critical path and an 8-row instruction ran ~10 us
    # where a 1-row one runs ~3 (70B TP8 decode ctx 1024, H200, session 12,
    # bench/results/normrows_*_2026-11-30_s12: norm_rows 1 cut B=16 9.84 -> 8.91 ms (-9.5%) and
    # B=64 11.26 -> 10.26 ms (-8.9%); at B=256 the timed runs disagreed with the journal's, so
    # steps over 64 tokens keep norm_rows)
    small_norm_rows: int = 1
    small_norm_max_tokens: int = 64
    # ... and in steps of at most norm_fill_max_tokens tokens (0: never) as few rows as make
    # about one instruction per SM, ceil(tokens / num_sms), between small_norm_rows and
    # norm_rows: under the op-major queue a layer's norm is a phase of its own, and at B=256
    # 32 eight-row instructions (~8.6 us each) left 100 of the 132 SMs idle. 70B TP8 decode ctx
    # 1024, H200, session 18 (bench/results/planab_{base,nr2}_2026-11-30_s18): two rows at
    # B=256 17.884 -> 17.153 ms (-4.1%), B=128 -12.4%, B=192 -4.5% (with the m128n128 O / DOWN
    # tiles); up to 1024: B=384 -0.9%, B=512 -0.8%, B=1024 -0.2% (8 rows there: unchanged; two
    # rows at B=1024, 512 instructions, were +0.4%)
    norm_fill_max_tokens: int = 1024
    # ... and in steps of at least big_norm_min_tokens tokens (0: never) ceil(tokens / num_sms)
    # rows, between norm_rows and big_norm_rows: at B=4096 a layer's 1024 eight-row norms cost
    # each ~4 us of protocol the GEMMs beside them lose (under norm_fold=2 they are off the
    # critical path). 70B TP8 decode ctx 256, H100 (bench/results/{normbig,nb4096}_*_s47_h100):
    # 32 rows at B=4096 145.82 -> 143.12 and 145.79 -> 142.53 ms (-1.9%, -2.2%), 64 rows +0.5%;
    # 32 rows at B=1024 +2.9%, B=256 +14%, the mixed step of 1280 tokens +0.3% (so not there)
    big_norm_rows: int = 32
    big_norm_min_tokens: int = 2048
    partial_rows: int = 0       # ATTN_PARTIAL rows; 0: max_batch_tokens * ceil(max_context/kv_split)
    # Split-K (mk/instructions/splitk.py) of QKV_ROPE / O_PROJ / GATE_UP / DOWN in steps of at most
    # splitk_max_tokens rows: 1 never; 0 auto (per op, the largest power of two nsplit with
    # tiles x nsplit <= num_sms, K / nsplit a multiple of splitk_align, nsplit <= max_split);
    # n >= 2 force n (capped at K / splitk_align slices; slices multiples of splitk_align).
    split_k: int = 1
    # auto split-K (split_k 0) in steps of at most split_fill_max_tokens rows (0: none): the
    # largest nsplit (<= max_split, <= K / splitk_align) with tiles x nsplit <= num_sms, any
    # integer, the K slices near-equal multiples of splitk_align (k_slices); in larger steps the
    # largest power of two as above. At B <= 64 QKV_ROPE's 10 head tiles split 13 ways instead
    # of 8 (130 SMs stream its 21 MB of weights instead of 80); the other ops' power-of-two
    # factors already fill the SMs there (O_PROJ / DOWN 64 x 2 and GATE_UP 28 x 4). Session 17
    # (70B TP8 decode, same GPU, journal on): B=1 8.454 -> 8.345 ms (-1.3%), B=16 -1.2%, B=64
    # -0.1%; in larger steps it lost (B=128 +1.5%, 13 for 8; B=256 +7.3%, 6 for 4), hence 64
    split_fill_max_tokens: int = 64
    # ... and in steps of more than split_uneven_min_tokens and at most split_uneven_max_tokens
    # rows (within the op's split cap; max 0: never) an op whose tiles leave SMs idle at the
    # even factor (fill or power of two, even_split) takes more splits with a short last K
    # slice (about half the others: uneven_split), queued after every full slice so that two
    # short ones share an SM. At 70B TP8 only QKV_ROPE there: at 1024 tokens its 80 head tiles
    # (unsplit: 80 SMs busy, 52 idle) in 86 + 42 K steps, at 512 its 40 in 52 + 52 + 24 instead
    # of 2 x 64. Session 19, H200, journal on (planab_{base_uv1k,uv1k,base_uvm,uvm}_2026-12-01_s19;
    # the 478-token check at --num-sms 48, where the tiny model's QKV splits 6 + 2 chunks, and
    # racecheck passed): B=1024 47.998 -> 46.830 ms (-2.4%; QKV_ROPE on the path 69.5 -> 42.9 us
    # per layer + a 13.0 us reduce), B=512 -0.9%, but B=256 +3.5% (its 20 tiles in 7 slices
    # instead of 4: SPLITK_REDUCE on the path 7.8 -> 11.2 us) and at B <= 64 (session 18's
    # rule, GATE_UP's 28 tiles in 29 + 29 + 29 + 29 + 12 K steps) B=1 / 16 / 64 +5.8% / +5.4% /
    # +6.5% (a 29-step slice ran 27.0 us where a 32-step one ran 29.5: at these sizes the fixed
    # cost per instruction is most of a slice), hence 256 < tokens <= 1024
    split_uneven_max_tokens: int = 1024
    split_uneven_min_tokens: int = 256
    num_sms: int = 132
    # 128: with the 128-row tiles of the M <= 256 class, auto split-K at B=256 (QKV in 4, O /
    # GATE_UP / DOWN in 2) made the 70B TP8 decode step 3.7% slower than no split (H200, session
    # 7, bench/results/splitk256_2026-11-29_s7.log)
    splitk_max_tokens: int = 128
    # An op's own cap when > 0 (0: splitk_max_tokens). At B=256 each token GEMM is one wave of
    # too few tiles (70B TP8: QKV_ROPE 20 tiles of ~65 us, O_PROJ / DOWN 64, GATE_UP 56, while
    # 132 SMs exist; session 8 journal), and splitting every op lost 3.7% (session 7). Each op's
    # split alone at B=256 (session 9, bench/results/opsplit_2026-11-30_s9*): QKV -11.2%,
    # GATE_UP -6.4%, DOWN 0, O_PROJ +2.8%; QKV and GATE_UP together -19.4% / -15.8% at B=192 /
    # 256, with DOWN too -18.5% / -3.3% (opcombo_2026-11-30_s9*). QKV_ROPE's cap went to 1024
    # in session 18: its 10 head tiles per token block are a third of the SMs up to ~512 tokens
    # (40 tiles at B=512 split in 2, 30 at B=384 in 4; from ~850 tokens its tiles fill the SMs
    # and auto split stops): B=384 24.962 -> 23.415 ms (-6.2%), B=512 26.635 -> 25.181 (-5.5%),
    # B=1024 -0.0% (planab_{nf1024,q1024}_2026-11-30_s18). The SPLITK workspace is sized to
    # what the factors need (auto_splitk_rows: 1536 rows, 48 MiB at 70B TP8)
    splitk_qkv_max_tokens: int = 1024
    splitk_o_max_tokens: int = 0
    splitk_gate_up_max_tokens: int = 256
    splitk_down_max_tokens: int = 0
    max_split: int = 16
    # token rows per SPLITK_REDUCE instruction in steps of at most splitk_reduce_max_tokens rows
    # (0: one per split output tile, all its rows). A reduce walks a thread's items one after the
    # other, each item's partial loads waited for before the next item's (more in flight spill:
    # the kernel's 168 registers are all in use), so a 64-row tile's reduce took 9.3 us at B=64,
    # four of them on each layer's critical path (bench/results/treeab_on_2026-11-30_s10.json);
    # cut into row slices it runs on as many more SMs with as many fewer items per thread. Slices
    # are cut only where the reduce signals this rank's own counter (QKV_ROPE and GATE_UP always,
    # O_PROJ and DOWN at TP 1); the counters' consumers wait for every slice. Session 10, H200,
    # decode ctx 1024 (rslice_*_2026-11-30_s10): B=64 14.05 -> 13.03 ms with 16 rows (-7.3%),
    # -3.1% with 8; B=256 +19.4% / +13.2% (its 128-row tiles became 8 / 16 slices each, 448 /
    # 896 GATE_UP reduces for 132 SMs), hence the token cap, and at most two reduces per SM per
    # op (plan_step's reduce_slice_rows makes slices taller past that). Steps of at most 16 tokens
    # are unchanged (a tile of <= 16 rows is one slice). Session 11 (rslice_*_2026-11-30_s11):
    # with the cap at 256, B=128 18.53 -> 16.02 ms (-13.5%), but B=192 +57% and B=256 +65%:
    # the cap was 128. Since session 18 only QKV_ROPE splits above 128 tokens (20 to 40 head
    # tiles, whose whole-tile reduces were 9-10 us per layer on the path at B=256..512), and
    # slices there gained (session 19, planab_{base,rs}_2026-12-01_s19, the 478-token check
    # first): B=256 15.128 -> 14.948 ms (-1.2%), B=384 -1.4%, B=512 -0.7%
    splitk_reduce_rows: int = 16
    # GATE_UP's rows per reduce slice (0: splitk_reduce_rows). With gu_m128n56 in the M <= 64
    # class (mk/tiles.py) its 64 tiles x 2 splits cut in 16-row slices made 256 reduces a layer
    # at B=64, +0.5% on decode (session 70); in 32-row slices, 128: H100, decode ctx 1024, B=64
    # 9.40 -> 9.25 / 9.31 ms (-1.6% / -0.7%, two runs, every op's slices at 32 rows) where 32-row
    # slices on the old tile lost 1.3% (bench/results/decab*_4b2b785_2026-12-08_s71_h100*).
    # Untimed: at 65..96 tokens (gu_m128n56 split in 2 too) it makes 192 reduces, not 256
    gate_up_reduce_rows: int = 32
    splitk_reduce_max_tokens: int = 1024
    splitk_align: int = tiles.BK    # K slice granularity (the GPU bodies need BK; tests go lower)
    # MiB of each layer's next GEMM weights that the SMs its attention leaves idle bring into L2
    # (L2_PREFETCH: O_PROJ's, then the first K columns of each of GATE_UP's K slices), in steps
    # whose attention instructions are fewer than num_sms; 0 = never. The megakernel compiles the
    # L2_PREFETCH body in only when this is > 0.
    l2_prefetch_mib: int = 0
    # ... leaving each K slice's first l2_prefetch_skip columns to the GEMM's own early weight
    # loads (an instruction claimed during the attention streams its first ring of
    # weight pages into shared memory then, so prefetching those columns into L2 too buys
    # nothing; 256 = four K steps of the ring), and O_PROJ's weights only when
    # l2_prefetch_o_proj is 1 (at B <= 64 an O_PROJ tile's K slice fits in the ring: its early
    # loads take all of it). 0 / 1 reproduce the prefetch of session 5 (session 6: no gain).
    # Session 16 (H200, 70B TP8 decode ctx 1024, bench/results/l2skip_*_2026-11-30_s16): skip 256
    # without O_PROJ lost at 40 MiB (B=1 +9.1%, B=64 +7.6%) and at 24 MiB (+3.7% / +5.2%): GATE_UP
    # on the critical path went 31.7 -> 30.8 us per layer while the attention, its reduce and
    # the norms, which run during the prefetch, slowed by more (ATTENTION 9.9 -> 13.5 us each)
    l2_prefetch_skip: int = 0
    l2_prefetch_o_proj: int = 1
    # 1 (default): where O_PROJ splits (TP 1), no SPLITK_REDUCE for it: the MLP norm after it sums
    # its rows' partials and adds the residual itself (mk/instructions/rows.py, "folded"), one
    # instruction and one dependency hop less per layer (at B=64 a reduce + hop is ~7-8.5 us of 134
    # per layer; bench/E2E_NOTES.md session 13). Bitwise the same step. Alone, 70B TP8 decode ctx
    # 1024 (H200, session 15, bench/results/foldo_*_2026-11-30_s15): B=1 -1.0%, B=16 -1.5%, B=64
    # -3.1%; two-layer checks, racecheck and memcheck clean
    fold_o_reduce: int = 1
    # 1 (default): the same for DOWN where it splits (TP 1): no SPLITK_REDUCE for it; the next
    # layer's attention norm finishes its tiles (layer 0's norm follows the prelude's EMBED, which
    # writes HIDDEN whole: its fold words are cleared), and the last layer's DOWN tiles are reduced
    # in the final section, before LM_NORM (whole tiles, once per step). Bitwise the same step.
    # With O_PROJ's (session 15, bench/results/foldboth_*_2026-11-30_s15): B=1 -2.7%, B=16
    # -4.5%, B=64 -6.2% (B=256 splits neither: unchanged); checks, racecheck, memcheck clean
    fold_down_reduce: int = 1
    # 1: the attention / MLP RMSNorm folded into the GEMM after it where that GEMM splits along
    # K (QKV_ROPE, GATE_UP): the weights carry the norm weight (mk.weights.fold_norms; the
    # backends refuse unfolded weights), the split tiles read the residual rows h themselves and
    # wait only for h's writer, the norm becomes a row-scale RMSNORM (ROW_SCALE = rsqrt(mean(h^2)
    # + eps), no normalized rows) that runs beside them, and the GEMM's SPLITK_REDUCE scales its
    # float32 sums by it (y = bf16(acc * r)): the norm leaves the critical path (B=64: ~11.9 of
    # 114.7 us a layer, bench/E2E_NOTES.md session 37). As accurate as HF's order
    # (bench/probes/norm_fold_probe.py), not bitwise the same step. A norm that finishes a split
    # O_PROJ / DOWN (fold_o_reduce / fold_down_reduce: B <= 128) writes h, so the GEMM waits
    # for it anyway: it stays a full RMSNORM, as where the GEMM does not split (both with the
    # folded weights' unit norm weight). GPU-verified at 0c857b2 (session 38: GPU tests,
    # two-layer checks, racecheck); 70B TP8 decode ctx 1024, megakernel only (bench/results/
    # normfold_*_s38): B=256 13.660 -> 13.520 ms (-1.0%, QKV's norm folded); B=64 with the
    # reduce folds off 8.790 -> 9.924 (+12.9%) and with O_PROJ / DOWN unsplit 9.892 (+12.5%):
    # at B=64 the norm phase is O_PROJ's / DOWN's reduce, which the fold cannot remove.
    # 2: also where the GEMM does not split (built in session 39, GPU-verified in session 41):
    # its unsplit tiles read h, wait only for h's writer, and scale their rows by ROW_SCALE in
    # the epilogue, after an epilogue wait for the row-scale RMSNORM (mk/instructions/_common.py
    # A_EPI_WAIT), which then runs beside their mainloops instead of before them; so the MLP
    # norm leaves the path from B=256 up (GATE_UP unsplit there), the attention norm above 1024
    # tokens, and neither writes its normalized rows (at B=4096 the norms were 5% of the SMs'
    # time and 91 us of a layer's path, session 21's journal). H200, 70B TP8 decode ctx 1024
    # (session 41, bench/results/nf2_*_s41): B=256 -3.1%, B=1024 -2.2% (norm_fold=1: -1.0% /
    # -1.1%).
    # 3: as 2, but an unsplit tile computes its rows' statistic itself from the h rows its
    # mainloop streams through its A pages (all of the hidden columns: A_EPI_WAIT = SELF_SCALE,
    # mk/instructions/_common.py), so a norm whose GEMM does not split is not emitted at all:
    # no row-scale RMSNORM (~3.8% of the SMs' busy time at B=1024, session 46's journal), no
    # epilogue wait. The megakernel compiles the statistic in where the plan has such tiles
    # (Megakernel(self_scale=True)). Built in session 46; correct on the GPU but slower
    # (session 47, H100, 70B TP8 decode, bench/results/nself_*_s47_h100: B=256 +9.1%, 1024
    # +4.2%, 4096 -0.3%, the mixed step +6.1%): every column tile of a token block re-reads its
    # A pages for the statistic, ~16 KiB of shared-memory loads a K step beside the wgmmas'
    # own, most of the shared-memory bandwidth left on the narrow gate-up tiles (a guess from
    # the arithmetic, not profiled). Kept as an option, not the default.
    # 4: as 2, but the statistic comes from the tiles that write h: unsplit O_PROJ / DOWN
    # RESIDUAL tiles and EMBED write each row's sums of squares over each 64 columns into
    # ROW_PART (mk/instructions/_common.py A_ROW_PART), and the QKV / gate-up tiles after them
    # (split: their SPLITK_REDUCEs) scale their rows from those sums (RowParts), so no norm is
    # planned where O_PROJ / DOWN stay whole, at TP 1 (elsewhere 2's plan). Built and GPU-checked
    # in session 49; H100, 70B TP8 (bench/results/nf4_summary_7e0568e_2026-12-05_s49_h100.json):
    # B=4096 -3.3% / -2.8%, 1024 -0.8% / -1.0%, mixed -0.2..-0.8%, B=256 +0.8% / +0.2%.
    # 0 here (the interpreter's and the tests' plans run the checkpoint's weights as they are);
    # the megakernel backend's default is 4 (mk.megakernel_step.DEFAULT_PLAN; 2 where the hidden
    # size does not allow 4), on folded
    # weights: a copy, or the engine's own weights folded in place (mk.engine owns_weights).
    norm_fold: int = 0
    # 1: where DOWN splits along K and GATE_UP does not, each DOWN split tile waits only for the
    # GATE_UP tiles of its K slice (the MLP_ACT columns it reads: a counter per token block and
    # DOWN K slice) instead of all of its block's GATE_UP tiles, so a slice's DOWN tiles can
    # start while GATE_UP's later columns still run (issue 5's fine-grained dependencies). Where
    # GATE_UP splits too, its partials share the SPLITK workspace with DOWN's (mk.verify finds
    # the race), so the block's waits stay. Needs every GATE_UP tile inside one slice (plan_step
    # says when not). 0 (default): one counter per block. Bitwise the same step. Not timed yet
    # (scripts/gpu_next.sh); in today's default plans DOWN splits only at <= 128 tokens, where
    # GATE_UP splits as well: raise splitk_down_max_tokens to use it
    down_slice_waits: int = 0

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"unknown queue policy {self.policy!r}; one of {POLICIES}")
        for name in TILE_FIELDS + ("kv_split", "attn_kv_heads", "norm_rows", "small_norm_rows",
                                   "big_norm_rows"):
            v = getattr(self, name)
            if v is None and name in TILE_FIELDS:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"PlanConfig.{name} must be a positive integer"
                                 f"{' or None (from the tile table)' if name in TILE_FIELDS else ''}"
                                 f", got {v!r}")
        if self.partial_rows < 0:
            raise ValueError(f"PlanConfig.partial_rows must be >= 0, got {self.partial_rows}")
        # (a kv_split_min at or over kv_split never spreads: the split size is at most kv_split)
        zero_ok = ("split_k", "l2_prefetch_mib", "l2_prefetch_skip", "kv_split_min",
                   "splitk_reduce_rows", "gate_up_reduce_rows",
                   "splitk_reduce_max_tokens", "small_norm_max_tokens", "split_fill_max_tokens",
                   "norm_fill_max_tokens", "big_norm_min_tokens", "attn_chunk_rows",
                   "split_uneven_max_tokens", "split_uneven_min_tokens"
                   ) + tuple(SPLITK_OP_CAPS.values())
        for name in ("num_sms", "splitk_max_tokens", "max_split", "splitk_align",
                     "kv_spread_min_splits", "raster_blocks") + zero_ok:
            v = getattr(self, name)
            lowest = 0 if name in zero_ok else 1
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lowest:
                raise ValueError(f"PlanConfig.{name} must be an integer >= {lowest}, got {v!r}")
        for name, values in (("attn_lpt", (0, 1, 2)), ("attn_chunk_splits", (0, 1)),
                             ("attn_chunk_reduce", (0, 1))):
            v = getattr(self, name)
            if isinstance(v, bool) or v not in values:
                raise ValueError(f"PlanConfig.{name} must be one of {values}, got {v!r}")
        if self.attn_lpt and self.policy != "op_major":
            raise ValueError(f"PlanConfig.attn_lpt={self.attn_lpt} orders op_major's queue only "
                             f"(policy {self.policy!r})")
        if self.l2_prefetch_skip % pf.GRANULE:
            raise ValueError(f"PlanConfig.l2_prefetch_skip must be a multiple of {pf.GRANULE} "
                             f"(16-byte prefetch granules), got {self.l2_prefetch_skip}")
        for name in ("fold_o_reduce", "fold_down_reduce", "l2_prefetch_o_proj", "down_slice_waits"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"PlanConfig.{name} must be 0 or 1, got {getattr(self, name)!r}")
        if isinstance(self.norm_fold, bool) or self.norm_fold not in (0, 1, 2, 3, 4):
            raise ValueError(f"PlanConfig.norm_fold must be 0 (off), 1 (where the GEMM splits), "
                             f"2 (also where it does not), 3 (2, the unsplit tiles computing "
                             f"their rows' statistic themselves) or 4 (2, the unsplit tiles "
                             f"scaled from the sums of squares h's writers leave in ROW_PART), "
                             f"got {self.norm_fold!r}")
        if isinstance(self.attn_pair, bool) or self.attn_pair not in (0, 1, 2):
            raise ValueError(f"PlanConfig.attn_pair must be 0 (never), 1 (auto) or 2 (always), "
                             f"got {self.attn_pair!r}")
        if self.split_k > self.max_split:
            raise ValueError(f"PlanConfig.split_k={self.split_k} is over max_split={self.max_split} "
                             f"(the SPLITK workspace holds max_split partials per row)")

    def validate_for(self, model: ModelConfig) -> None:
        """The explicit values against the model: QKV tiles hold whole heads, so qkv_tile is a
        multiple of head_dim (a value below head_dim means the minimum, one head per tile)."""
        D = model.head_dim
        if self.qkv_tile is not None and self.qkv_tile > D and self.qkv_tile % D:
            raise ValueError(f"PlanConfig.qkv_tile={self.qkv_tile} is not a multiple of head_dim "
                             f"{D} (QKV_ROPE tiles hold whole heads)")

    def step_tiles(self, num_tokens: int, num_seqs: int, model: ModelConfig,
                   kernel: KernelConfig) -> tiles.StepTiles:
        """The tiling of a step of num_tokens rows and num_seqs sequences."""
        qkv = None if self.qkv_tile is None else max(self.qkv_tile, model.head_dim)
        return tiles.step_tiles(num_tokens, num_seqs, model.head_dim, kernel.token_block,
                                token_block=self.token_block, qkv=qkv, o=self.o_tile,
                                mlp=self.mlp_tile, down=self.down_tile, lm=self.lm_tile)

    def norm_rows_for(self, num_tokens: int) -> int:
        """Rows per RMSNORM / LM_NORM instruction in a step of num_tokens tokens."""
        fill = -(-num_tokens // self.num_sms)           # about one instruction per SM
        if num_tokens <= self.small_norm_max_tokens:
            return min(self.norm_rows, self.small_norm_rows)
        if num_tokens <= self.norm_fill_max_tokens:
            return min(self.norm_rows, max(self.small_norm_rows, fill))
        if self.big_norm_min_tokens and num_tokens >= self.big_norm_min_tokens:
            return max(self.norm_rows, min(self.big_norm_rows, fill))
        return self.norm_rows

    def attn_chunk_for(self, qpk: int) -> int:
        """Rows per prefill ATTENTION chunk (attn_chunk_rows rounded up to whole M tiles of
        128 // qpk tokens; 0: no chunks)."""
        if not self.attn_chunk_rows:
            return 0
        tile = max(1, at.ATTN_TILE_ROWS // qpk)
        return tile * -(-self.attn_chunk_rows // tile)

    def max_partial_rows(self, kernel: KernelConfig) -> int:
        # spread decode splits add at most 2 rows per SM (spread_kv_splits: <= num_sms split
        # instructions over < num_sms decode segments, one row each)
        spread = 2 * self.num_sms if self.kv_split_min else 0
        return self.partial_rows or (kernel.max_batch_tokens
                                     * math.ceil(kernel.max_context / self.kv_split) + spread)

    def spread_kv_splits(self, seg_rows: np.ndarray, seg_ctx: np.ndarray, ngrp: int) -> np.ndarray:
        """Keys per attention split of each segment of a step (see kv_split_min): kv_split, or
        for the decode segments (one row) of a step with fewer than num_sms attention
        instructions one smaller size, so that their keys fill the SMs the other segments leave
        (when the longest decode context then has kv_spread_min_splits splits or more)."""
        out = np.full(len(seg_ctx), self.kv_split, np.int64)
        if not self.kv_split_min or not len(seg_ctx):
            return out
        units = ngrp * -(-seg_ctx // self.kv_split)
        dec = seg_rows == 1
        if int(units.sum()) >= self.num_sms or not dec.any():
            return out
        free = max(self.num_sms - int(units[~dec].sum()), 1)
        need = -(-int(seg_ctx[dec].sum()) * ngrp // free)          # keys per split instruction
        size = min(max(self.kv_split_min * -(-need // self.kv_split_min), self.kv_split_min),
                   self.kv_split)
        if size * self.kv_spread_min_splits > int(seg_ctx[dec].max()):
            return out                  # too few splits to pay for their ATTN_REDUCE
        out[dec] = size
        return out

    def attn_pairs(self, cand: np.ndarray, group: np.ndarray, ctx: np.ndarray,
                   n_attn: int) -> tuple[np.ndarray, np.ndarray]:
        """The decode units paired by attn_pair: candidates cand (attention instruction indices)
        with their pairing group (token block x KV group) and context; n_attn instructions in
        all. Within a group the units are sorted by context and paired neighbour with neighbour;
        auto (1) takes n_attn - num_sms pairs, the groups' first pairs first. Returns the
        indices (first, second) of each pair."""
        none = np.zeros(0, np.int64)
        if not self.attn_pair or len(cand) < 2:
            return none, none
        want = len(cand) // 2 if self.attn_pair == 2 else n_attn - self.num_sms
        if want <= 0:
            return none, none
        order = np.lexsort((cand, ctx, group))
        sc, sg = cand[order], group[order]
        start = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])
        run = np.diff(np.r_[start, len(sc)])
        rank = np.arange(len(sc)) - np.repeat(start, run)
        last = np.repeat(start + run, run)
        first = np.flatnonzero((rank % 2 == 0) & (np.arange(len(sc)) + 1 < last))
        take = first[np.lexsort((sg[first], rank[first]))][:want]
        take.sort()
        return sc[take], sc[take + 1]

    def splitk_rows(self, kernel: KernelConfig, model: ModelConfig,
                    parallel: ParallelConfig) -> int:
        """SPLITK rows: room for the partials of every splittable step (0: never split). Forced
        split_k partials of every row of the largest such step; auto, what its factors need
        (auto_splitk_rows: 48 MiB at 70B TP8, where max_split x 1024 rows would be 512)."""
        if self.split_k == 1:
            return 0
        if self.split_k >= 2:
            return self.split_k * min(self.splitk_token_cap(), kernel.max_batch_tokens)
        return auto_splitk_rows(self, kernel, model, parallel)

    def splitk_token_cap(self, op=None) -> int:
        """The largest step (token rows) in which op (None: any op) may split."""
        if op is None:
            return max(self.splitk_token_cap(o) for o in SPLITK_OP_CAPS)
        field = SPLITK_OP_CAPS.get(Op(op))
        return (getattr(self, field) if field else 0) or self.splitk_max_tokens

    def split_ops(self, min_tokens: int) -> frozenset:
        """The opcodes split_factors may split in a step of at least min_tokens rows (an M
        class's smallest step): the megakernel variant of that class compiles only their split
        tiles in (mk.megakernel.GemmSlot.splits)."""
        if self.split_k == 1:
            return frozenset()
        return frozenset(int(op) for op in SPLITK_OP_CAPS
                         if min_tokens <= self.splitk_token_cap(op))

    def split_factors(self, num_tokens: int, tile_counts: dict, ks: dict) -> dict:
        """nsplit per op ({op: output tiles of the step}, {op: K}) for a step of num_tokens rows."""
        out = {op: 1 for op in tile_counts}
        if self.split_k == 1:
            return out
        for op, ntiles in tile_counts.items():
            if num_tokens > self.splitk_token_cap(op):
                continue
            chunks = ks[op] // self.splitk_align
            if self.split_k >= 2:
                out[op] = max(1, min(self.split_k, chunks))
                continue
            ns = self.even_split(num_tokens, ntiles, ks[op])
            uneven = self.uneven_split(num_tokens, ntiles, ks[op])
            if uneven:
                ns = uneven[0]
            out[op] = ns
        return out

    def even_split(self, num_tokens: int, ntiles: int, K: int) -> int:
        """Auto split-K's factor of near-equal slices for an op of ntiles output tiles and K
        columns in a step of num_tokens rows (its token cap not applied): the fill factor in
        steps of at most split_fill_max_tokens rows, else the largest power of two."""
        chunks = K // self.splitk_align
        if K % self.splitk_align:
            return 1
        if num_tokens <= self.split_fill_max_tokens:
            return max(1, min(self.max_split, chunks, self.num_sms // max(ntiles, 1)))
        ns = 1
        while (2 * ns <= self.max_split and ntiles * 2 * ns <= self.num_sms
               and chunks % (2 * ns) == 0):
            ns *= 2
        return ns

    def uneven_split(self, num_tokens: int, ntiles: int, K: int) -> tuple[int, int] | None:
        """(nsplit, K chunks of each full slice) of an uneven split (split_uneven_min_tokens <
        num_tokens <= split_uneven_max_tokens) of an op of ntiles output tiles and K columns in
        a step of num_tokens rows, or None where it does not apply or the even factor's
        near-equal slices are as short. Each tile gets nsplit - 1 full slices of c chunks and a
        last one of at most c / 2, so that the tiles' last slices, two to an SM, fit with the
        full ones in num_sms: ntiles * (nsplit - 1) + ceil(ntiles / 2) <= num_sms."""
        if (self.split_k != 0 or K % self.splitk_align
                or num_tokens > min(self.split_uneven_max_tokens, self.splitk_token_cap())
                or num_tokens <= self.split_uneven_min_tokens):
            return None
        chunks, m = K // self.splitk_align, max(ntiles, 1)
        even = self.even_split(num_tokens, ntiles, K)
        ns = min(self.max_split, chunks, (self.num_sms - (m + 1) // 2) // m + 1)
        if ns < 2:
            return None
        c = -(-2 * chunks // (2 * ns - 1))
        last = chunks - (ns - 1) * c
        if last <= 0 or 2 * last > c or c >= -(-chunks // even):
            return None
        return ns, c

    def op_k_slices(self, num_tokens: int, ntiles: int, K: int, nsplit: int) -> np.ndarray:
        """Bounds [nsplit + 1] of an op's K slices in a step (ntiles: the op's output tiles of
        the step): uneven_split's where it chose nsplit, else k_slices'."""
        uneven = self.uneven_split(num_tokens, ntiles, K)
        if uneven and uneven[0] == nsplit:
            b = self.splitk_align * uneven[1] * np.arange(nsplit + 1)
            b[-1] = K
            return b
        return self.k_slices(K, nsplit)

    def reduce_slice_rows(self, op, num_tokens: int, block_rows, tiles_per_block: int,
                          nsplit: int, tp1: bool = True) -> np.ndarray:
        """Rows per SPLITK_REDUCE slice of op's split tiles in each token block (block_rows: the
        blocks' rows; tiles_per_block: op's output tiles in a block): splitk_reduce_rows (GATE_UP:
        gate_up_reduce_rows), or more where op would get over two reduces per SM (B=64's 256
        O_PROJ / DOWN reduces on 132 SMs gained, B=256's 896 GATE_UP reduces lost 19.4%), or, in
        steps of several token blocks, over what the split tiles leave free (below); 0 = whole
        tiles (also where op does not split, the step is over splitk_reduce_max_tokens, or its
        reduce signals a peer: O_PROJ / DOWN at TP > 1 (tp1 False), whose TP_REDUCE counts
        tiles). plan_step cuts its reduces so, and bench/gemm.py its whole matrices' as the step
        would."""
        block_rows = np.asarray(block_rows)
        nb = len(block_rows)
        R = self.splitk_reduce_rows
        if op == Op.GATE_UP and R:
            R = self.gate_up_reduce_rows or R
        if (nsplit <= 1 or not R or num_tokens > self.splitk_reduce_max_tokens
                or (op in (Op.O_PROJ, Op.DOWN) and not tp1)):
            return np.zeros(nb, np.int64)
        per_tile = max(1, 2 * self.num_sms // (nb * tiles_per_block))
        if nb > 1:
            # a block's reduces are queued before the next block's split tiles of op (the
            # policies' block-diagonal order) and each holds an SM while it waits for its tile's
            # splits: they may take only the SMs that the split tiles of this block and the next
            # leave (session 11, cap raised to 256: B=256's 112 GATE_UP reduces of block 0 held
            # the SMs that block 1's 56 split tiles needed, +65%; rslice_16_2026-11-30_s11.json)
            free = self.num_sms - 2 * nsplit * tiles_per_block
            per_tile = min(per_tile, max(1, free // tiles_per_block))
        return np.maximum(R, -(-block_rows // per_tile))

    def k_slices(self, K: int, nsplit: int) -> np.ndarray:
        """Bounds [nsplit + 1] of the K slices: near-equal multiples of splitk_align (the last
        slice ends at K)."""
        chunks = K // self.splitk_align
        b = self.splitk_align * (np.arange(nsplit + 1) * chunks // nsplit)
        b[-1] = K
        return b


def splitk_width(model: ModelConfig, parallel: ParallelConfig) -> int:
    """SPLITK columns: the widest partial of the splittable ops (GATE_UP holds gate and up)."""
    D = model.head_dim
    hq, hkv = parallel.heads_local(model), parallel.kv_heads_local(model)
    return max(model.hidden_size, 2 * parallel.intermediate_local(model), (hq + 2 * hkv) * D)


# Buffers ------------------------------------------------------------------------------------------
def buffer_shapes(model: ModelConfig, parallel: ParallelConfig, kernel: KernelConfig,
                  plan_cfg: PlanConfig = PlanConfig()) -> dict[Buf, tuple[int, int]]:
    """[rows, width] of every named buffer of one rank (the VM and the megakernel allocate these)."""
    T, H, D = kernel.max_batch_tokens, model.hidden_size, model.head_dim
    hq, hkv = parallel.heads_local(model), parallel.kv_heads_local(model)
    n = parallel.tp_size
    P = plan_cfg.max_partial_rows(kernel)
    kv_rows = model.num_layers * kernel.kv_pages * kernel.page_size
    return {
        Buf.HIDDEN: (T, H), Buf.NORMED: (T, H), Buf.SCRATCH: (T, H),
        Buf.Q: (T, hq * D), Buf.ATTN_OUT: (T, hq * D),
        Buf.MLP_ACT: (T, parallel.intermediate_local(model)),
        Buf.RECV: (n * T, H),
        Buf.ATTN_PARTIAL: (P, hq * D), Buf.ATTN_LSE: (P, hq),
        Buf.LAST_NORMED: (kernel.max_seqs, H),
        Buf.LOGITS: (kernel.max_seqs, parallel.vocab_local(model)),
        Buf.K_CACHE: (kv_rows, hkv * D), Buf.V_CACHE: (kv_rows, hkv * D),
        Buf.SPLITK: splitk_shape(plan_cfg, kernel, model, parallel),
        Buf.ROW_SCALE: (T, 1),
        Buf.ROW_PART: (T, mc.row_part_ld(H)),
    }


# _emit_gemm's row_scale_wait for unsplit tiles that compute their rows' statistic themselves
# (PlanConfig.norm_fold=3; their A_EPI_WAIT word is mk.instructions._common.SELF_SCALE)
SELF_SCALED = "self-scaled"


def plans_norm(row_scale_wait) -> bool:
    """Whether a norm is planned before the GEMM of that row_scale_wait (_emit_gemm's): not where
    its tiles take the statistic themselves (SELF_SCALED, norm_fold=3) or from h's writers
    (RowParts, norm_fold=4)."""
    return row_scale_wait is not SELF_SCALED and not isinstance(row_scale_wait, RowParts)


@dataclass(frozen=True)
class RowParts:
    """_emit_gemm's row_scale_wait for unsplit tiles scaled from ROW_PART (PlanConfig.norm_fold=4;
    their A_EPI_WAIT word is mk.instructions._common.ROW_PARTS, A_EPI_TARGET the set's first
    column `base`)."""
    base: int


def row_scale_rows(tokens: int, width: int) -> int:
    """SPLITK rows (of width floats) the GPU's ROW_SCALE takes at the end of the SPLITK
    allocation: its last `tokens` floats (KernelConfig.max_batch_tokens, the arena's token rows;
    mk.instructions.base.Buf.ROW_SCALE)."""
    return -(-tokens // width)


def row_part_rows(tokens: int, width: int, hidden: int) -> int:
    """SPLITK rows (of width floats) the GPU's ROW_PART takes before ROW_SCALE's
    (PlanConfig.norm_fold=4; mk.instructions.base.Buf.ROW_PART: [tokens, 2 * ceil(hidden / 64)]
    floats, ending at the 16-byte boundary before ROW_SCALE's last `tokens` floats,
    mk.instructions._common.row_part_offset: the at most 3 floats that rounding costs fit
    in ROW_SCALE's rows, since width is a multiple of 4)."""
    return -(-tokens * mc.row_part_ld(hidden) // width)


def splitk_shape(plan_cfg: PlanConfig, kernel: KernelConfig, model: ModelConfig,
                 parallel: ParallelConfig) -> tuple[int, int]:
    """[rows, width] of the SPLITK allocation: the partials' rows (PlanConfig.splitk_rows), then
    ROW_PART's under norm_fold=4 (row_part_rows), then ROW_SCALE's (row_scale_rows); (0, width)
    where the plans never split."""
    rows, width = plan_cfg.splitk_rows(kernel, model, parallel), splitk_width(model, parallel)
    # norm_fold=2 scales unsplit tiles' rows too: ROW_SCALE whether or not anything splits;
    # norm_fold=3 / 4 too: their tiles read no ROW_SCALE, but their code lives in the split-K
    # variant's bodies (gk.SplitTile), built only with a SPLITK workspace
    need = rows or plan_cfg.norm_fold >= 2
    T = kernel.max_batch_tokens
    if plan_cfg.norm_fold == 4:
        rows += row_part_rows(T, width, model.hidden_size)
    return (rows + row_scale_rows(T, width) if need else 0, width)


FLOAT32_BUFFERS = (Buf.ATTN_PARTIAL, Buf.ATTN_LSE, Buf.LOGITS, Buf.SPLITK, Buf.ROW_SCALE,
                   Buf.ROW_PART)


def buffer_dtype(buf: Buf, model_dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if buf in FLOAT32_BUFFERS else model_dtype


# Step metadata ------------------------------------------------------------------------------------
@dataclass
class StepMeta:
    """The step's int32 metadata buffer (layout: mk.instructions._common, M_* and SEQ_*)."""

    tensor: torch.Tensor            # int32 [words]
    num_tokens: int
    num_seqs: int
    seq_row0: np.ndarray            # per sequence (host-side copies, for the planner)
    seq_rows: np.ndarray
    seq_start: np.ndarray
    page_off: np.ndarray            # absolute word offset of each sequence's page table
    last_rows: np.ndarray

    def word(self, i: int) -> int:
        return int(self.tensor[i])

    def section(self, header_word: int, length: int) -> torch.Tensor:
        off = self.word(header_word)
        return self.tensor[off:off + length]

    @property
    def tokens(self) -> torch.Tensor:
        return self.section(mc.M_OFF_TOKENS, self.num_tokens)

    @property
    def positions(self) -> torch.Tensor:
        return self.section(mc.M_OFF_POS, self.num_tokens)

    @property
    def kv_slots(self) -> torch.Tensor:
        return self.section(mc.M_OFF_SLOT, self.num_tokens)


def build_meta(batch: StepBatch, kernel: KernelConfig, validate: bool = True) -> StepMeta:
    """The metadata buffer; with `validate`, refuse a batch the shapes or the KV cache cannot hold
    (the checks of StepBatch.validate, vectorised)."""
    ps = kernel.page_size
    seqs = batch.seqs
    S = len(seqs)
    if S == 0:
        raise ValueError("empty batch")
    lens = np.fromiter(map(len, (s.tokens for s in seqs)), np.int64, S)
    start = np.fromiter((s.start_pos for s in seqs), np.int64, S)
    T = int(lens.sum())
    row0 = np.zeros(S, np.int64)
    np.cumsum(lens[:-1], out=row0[1:])
    npages = -(-(start + lens) // ps)
    have = np.fromiter(map(len, (s.pages for s in seqs)), np.int64, S)
    if validate:
        _validate(batch, kernel, lens, start, npages, have, T)
    tokens = np.fromiter(chain.from_iterable(s.tokens for s in seqs), np.int64, T)
    # each sequence's page table as given (an engine allocates a request's pages up front), up to
    # the compiled maximum context's pages, not cut to the pages this step reaches: the layout
    # then stays the same from one decode step to the next (the Planner's fast path)
    keep = np.minimum(have, -(-kernel.max_context // ps))
    if bool((have == keep).all()):
        pages = np.fromiter(chain.from_iterable(s.pages for s in seqs), np.int64, int(keep.sum()))
    else:
        pages = np.fromiter(chain.from_iterable(s.pages[:k] for s, k in zip(seqs, keep.tolist())),
                            np.int64, int(keep.sum()))
    if validate and len(pages) and (int(pages.min()) < 0 or int(pages.max()) >= kernel.kv_pages):
        bad = int(np.flatnonzero((pages < 0) | (pages >= kernel.kv_pages))[0])
        s_bad = int(np.searchsorted(np.cumsum(npages), bad, side="right"))
        raise ValueError(f"sequence {s_bad} has KV page id {int(pages[bad])} outside "
                         f"[0, {kernel.kv_pages})")
    seq_of = np.repeat(np.arange(S), lens)
    pos = np.arange(T) - row0[seq_of] + start[seq_of]
    poff_rel = np.zeros(S, np.int64)
    np.cumsum(keep[:-1], out=poff_rel[1:])
    slot = pages[poff_rel[seq_of] + pos // ps] * ps + pos % ps
    off_tokens = mc.META_HEADER
    off_pos = off_tokens + T
    off_slot = off_pos + T
    off_seq = off_slot + T
    off_last = off_seq + S * mc.SEQ_WORDS
    off_pages = off_last + S
    words = off_pages + len(pages)
    m = np.zeros(words, np.int64)
    m[mc.M_NUM_TOKENS], m[mc.M_NUM_SEQS] = T, S
    m[mc.M_OFF_TOKENS], m[mc.M_OFF_POS], m[mc.M_OFF_SLOT] = off_tokens, off_pos, off_slot
    m[mc.M_OFF_SEQ], m[mc.M_OFF_LAST], m[mc.M_OFF_PAGES] = off_seq, off_last, off_pages
    m[mc.M_PAGE_SIZE], m[mc.M_KV_LAYER_STRIDE] = ps, kernel.kv_pages * ps
    m[mc.M_WORDS] = words
    m[off_tokens:off_pos], m[off_pos:off_slot], m[off_slot:off_seq] = tokens, pos, slot
    page_off = off_pages + poff_rel
    st = np.stack([row0, lens, start, page_off], axis=1)
    m[off_seq:off_last] = st.reshape(-1)
    last = row0 + lens - 1
    m[off_last:off_pages] = last
    m[off_pages:] = pages
    return StepMeta(torch.from_numpy(m.astype(np.int32)), T, S, row0, lens, start, page_off, last)


def _validate(batch, kernel, lens, start, npages, have, T) -> None:
    def first(mask):
        return int(np.flatnonzero(mask)[0])
    if T > kernel.max_batch_tokens:
        raise ValueError(f"batch has {T} tokens, over the maximum {kernel.max_batch_tokens}")
    if len(lens) > kernel.max_seqs:
        raise ValueError(f"batch has {len(lens)} sequences, over max_seqs {kernel.max_seqs}")
    if (lens == 0).any():
        raise ValueError(f"sequence {first(lens == 0)} has no new tokens")
    if (start < 0).any():
        raise ValueError(f"sequence {first(start < 0)} has negative start_pos")
    if (start + lens > kernel.max_context).any():
        i = first(start + lens > kernel.max_context)
        raise ValueError(f"sequence {i} reaches context {int(start[i] + lens[i])}, over the maximum "
                         f"{kernel.max_context}")
    if (have < npages).any():
        i = first(have < npages)
        raise ValueError(f"sequence {i} needs {int(npages[i])} KV pages for {int(start[i] + lens[i])} "
                         f"tokens, its page table has {int(have[i])}")


def to_device(host: torch.Tensor, device=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """A host tensor's copy on `device` (or into `out`), queued in the current stream's order
    without the host waiting for the work queued before it: to a CUDA device through a
    page-locked copy (torch's caching host allocator keeps it until the copy has run). A plain
    .to(cuda) from pageable memory waits for the stream, which holds the running step when the
    engine queues the next one behind it (mk.engine: run ahead)."""
    device = out.device if out is not None else torch.device(device)
    fast = device.type == "cuda" and host.device.type == "cpu"
    if out is None:
        return host.pin_memory().to(device, non_blocking=True) if fast else host.to(device)
    return out.copy_(host.pin_memory(), non_blocking=True) if fast else out.copy_(host)


# The plan -----------------------------------------------------------------------------------------
# the attention words the fast path rewrites: A_POS0 .. A_NEW0_B as one block (the words between
# them, A_KV0 .. A_SLOT, A_ROW0_B and A_PAGE_OFF_B, keep their values)
_ADV_WORDS = (at.A_POS0, at.A_KV1, at.A_NEW0, at.A_POS0_B, at.A_NEW0_B)
ADV_WORD0, ADV_WORD1 = min(_ADV_WORDS), max(_ADV_WORDS) + 1


class StreamAdvance:
    """The Planner fast path's rewrite of a stream: in the body's [L, per_layer] view (the rows
    after `prelude`), rows j of every layer get `block[i]` in words word0 .. word0 + width - 1.
    One block of adjacent words (the words between the changed ones keep their values) and a
    slice when j is a run of rows: each row is written once, not once per word (at B=4096 the
    per-word scatter took 11 ms of host per step)."""

    def __init__(self, prelude: int, layers: int, per_layer: int, j: np.ndarray, word0: int,
                 block: np.ndarray):
        self.prelude, self.layers, self.per_layer = prelude, layers, per_layer
        self.word0, self.block = word0, np.ascontiguousarray(block, np.int32)
        run = len(j) > 0 and int(j[-1]) - int(j[0]) + 1 == len(j)
        self.j = slice(int(j[0]), int(j[-1]) + 1) if run else j

    def apply_host(self, stream: np.ndarray) -> None:
        """Rewrite the host stream ([N, INSTR_WORDS] int32 numpy) in place."""
        pre, L, m = self.prelude, self.layers, self.per_layer
        body = stream[pre:pre + L * m].reshape(L, m, INSTR_WORDS)
        body[:, self.j, self.word0:self.word0 + self.block.shape[1]] = self.block

    def apply(self, stream: torch.Tensor) -> None:
        """Rewrite `stream` ([N, INSTR_WORDS] int32, on any device) in place, in its device's
        stream order (one small copy and one index write; the host does not wait)."""
        pre, L, m = self.prelude, self.layers, self.per_layer
        body = stream[pre:pre + L * m].view(L, m, INSTR_WORDS)
        j = self.j if isinstance(self.j, slice) else to_device(torch.from_numpy(self.j),
                                                              stream.device)
        body[:, j, self.word0:self.word0 + self.block.shape[1]] = \
            to_device(torch.from_numpy(self.block), stream.device)


@dataclass
class StepPlan:
    instrs: torch.Tensor            # int32 [N, 32], rank `rank`'s stream
    meta: StepMeta
    targets: torch.Tensor           # int32 [num_counters]
    rank: int
    tp: int
    hidden_slice: int               # H / n: TP_REDUCE columns of rank r are [r*slice, (r+1)*slice)
    layout: dict = field(default_factory=dict)  # counter layout (for describe_counter)
    tiles: "tiles.StepTiles | None" = None      # the step's tiling (token block, tile widths)
    # Planner: the number of the full plan whose structure this one has (a full plan: its own),
    # and for a fast-path plan the words it rewrote in that stream (StreamAdvance): a copy of any
    # earlier stream of the same serial becomes this one with StreamAdvance.apply
    serial: int = 0
    advance: "StreamAdvance | None" = None

    @property
    def num_counters(self) -> int:
        return int(self.targets.numel())

    def __len__(self) -> int:
        return int(self.instrs.shape[0])

    def for_rank(self, r: int) -> "StepPlan":
        if r == self.rank:
            return self
        instrs = self.instrs.clone()
        red = instrs[:, W_OPCODE] == int(Op.TP_REDUCE)
        instrs[red, W_COL0] += (r - self.rank) * self.hidden_slice
        return StepPlan(instrs, self.meta, self.targets, r, self.tp, self.hidden_slice, self.layout,
                        self.tiles)

    def instructions(self) -> list[Instruction]:
        return [Instruction.decode(w) for w in self.instrs.tolist()]

    def accesses(self, i: int | Instruction, rank: int | None = None) -> Accesses:
        instr = Instruction.decode(self.instrs[i].tolist()) if isinstance(i, int) else i
        return instruction_accesses(instr, self.rank if rank is None else rank, self.meta)

    def describe_counter(self, c: int) -> str:
        lay = self.layout
        if not lay:
            return f"c{c}"
        cpl, L = lay["cpl"], lay["num_layers"]
        if c >= (L + 1) * cpl:
            k = c - (L + 1) * cpl
            return (["LM_NORM done", "LM_HEAD done"][k] if k < 2
                    else f"last layer's DOWN reduced, block {k - 2}") + f" (c{c})"
        blk, rel = divmod(c, cpl)
        where = "prelude (embed)" if blk == 0 else f"layer {blk - 1}"
        for name, (off, size) in lay["groups"].items():
            if off <= rel < off + size:
                return f"{where} {name}[{rel - off}] (c{c})"
        return f"c{c}"

    def representative_rows(self) -> torch.Tensor | None:
        """Row indices of the prelude, the first and the last layer and the final instructions.
        The planner builds layer l as the layer template plus l in the layer word and l * cpl in
        every counter word, an unsplit folded GEMM tile's epilogue wait included (and with
        PlanConfig.fold_down_reduce clears the fold words of layer 0's attention norms: the
        first layer is among these rows), so a per-instruction check
        that holds on these rows (bounds of rows, columns, K, buffers, the smallest and largest
        layer and counter ids) holds on the whole
        stream: mk.megakernel_step checks only them, 1/40 of the rows of an 80-layer step
        (check_plan of the 70B TP8 rank's decode step: 19 ms in full). None: not a planner-made
        layout (check everything)."""
        shape = self._template_shape()
        if shape is None:
            return None
        pre, m, fin, L = shape
        first = torch.arange(pre + m)
        last = torch.arange(pre + (L - 1) * m, len(self)) if L > 1 else torch.arange(pre + m, len(self))
        return torch.cat([first, last])

    def representative_stream(self) -> torch.Tensor:
        """self.instrs[self.representative_rows()], from two slices (a fancy index of an 80-layer
        stream costs milliseconds; the slices' copy microseconds); the whole stream when the
        layout is not a planner's."""
        rows = self.representative_rows()
        if rows is None:
            return self.instrs
        t = self.layout["template"]
        head = t["prelude"] + t["per_layer"]
        tail = int(rows[head]) if len(rows) > head else len(self)
        return torch.cat([self.instrs[:head], self.instrs[tail:]])

    def _template_shape(self) -> tuple[int, int, int, int] | None:
        """(prelude rows, rows per layer, final rows, layers) of a planner-made stream (the
        layer template repeated), else None."""
        t = self.layout.get("template") if self.layout else None
        if t is None:
            return None
        shape = (t["prelude"], t["per_layer"], t["final"], self.layout["num_layers"])
        pre, m, fin, L = shape
        return shape if pre + L * m + fin == len(self) else None

    def uploaded_rows(self) -> int:
        """The rows device_stream copies to the device: the prelude, three layers and the final
        rows of a planner-made stream of at least four layers, else all of them."""
        shape = self._template_shape()
        if shape is None or shape[3] < 4 or shape[1] == 0:
            return len(self)
        pre, m, fin, _ = shape
        return pre + 3 * m + fin

    def device_stream(self, device) -> torch.Tensor:
        """self.instrs on `device`, uploading only the prelude, the first three layers and the
        final rows (~4 / 80 of an 80-layer stream) and building layers 3 .. L-1 there as layer 1
        plus (l - 1) times the difference of layers 2 and 1: the planner makes layer l the layer
        template plus l in the layer word and l * cpl in every counter word (layer 0 may differ:
        PlanConfig.fold_down_reduce), and the fast path rewrites the same words in every layer.
        The planner's streams keep the rule by construction (tests/test_plan.py); the last
        layer's host rows are compared with it first all the same (a stream that breaks it
        there is uploaded whole). Why: a step the fast path cannot take uploaded its whole
        stream, 12 MiB for 256 decodes + a 1024-token prompt, 40 MiB for a 4096-token prompt of
        the 70B TP8 rank, through a synchronous pageable copy every such step."""
        n = len(self)
        if self.uploaded_rows() == n:
            return to_device(self.instrs, device)
        pre, m, _, L = self._template_shape()
        body0 = pre + m                         # layer 1's first row
        host = self.instrs
        l1, l2 = host[body0:body0 + m], host[body0 + m:body0 + 2 * m]
        last = host[pre + (L - 1) * m:pre + L * m]
        if not torch.equal(last, l1 + (L - 2) * (l2 - l1)):
            return to_device(self.instrs, device)
        head = to_device(host[:body0 + 2 * m], device)
        out = torch.empty((n, host.shape[1]), dtype=host.dtype, device=device)
        out[:body0 + 2 * m] = head
        d1 = head[body0:]                       # layers 1 and 2 on the device
        inc = d1[m:] - d1[:m]
        k = torch.arange(2, L - 1, dtype=host.dtype, device=device).view(-1, 1, 1)
        torch.add(d1[:m].unsqueeze(0), k * inc.unsqueeze(0),
                  out=out[body0 + 2 * m:pre + L * m].view(L - 3, m, host.shape[1]))
        out[pre + L * m:] = to_device(host[pre + L * m:], device)
        return out

    def save(self, path) -> None:
        torch.save({"instrs": self.instrs, "meta": self.meta.tensor, "targets": self.targets}, path)


_FAMILIES: dict = {}


def instruction_accesses(instr: Instruction, rank: int, meta: StepMeta | None) -> Accesses:
    """Accesses of any instruction: families of the model's opcodes take the step metadata."""
    fam = _FAMILIES.get(instr.opcode)
    if fam is None:
        fam = _FAMILIES[instr.opcode] = family_of(instr.opcode)
    if instr.opcode in (Op.NOOP, Op.COPY, Op.RESIDUAL_ADD, Op.RMSNORM):
        return fam.accesses(instr, rank)
    return fam.accesses(instr, rank, meta)


# Template construction ----------------------------------------------------------------------------
class _Group:
    __slots__ = ("words", "stage", "block")

    def __init__(self, words, stage, block):
        self.words, self.stage, self.block = words, stage, block


def _emit(groups: list, stage: int, op: int, block, *, row0, rows, col0, cols, waits=(),
          signal=NO_COUNTER, scope=SignalScope.LOCAL, srank=0, args: dict | None = None,
          count=1) -> None:
    block = np.asarray(block, np.int64)
    n = block.shape[0]
    if n == 0:
        return
    w = np.zeros((n, INSTR_WORDS), np.int64)
    w[:, W_OPCODE] = int(op)
    w[:, W_ROW0], w[:, W_ROWS], w[:, W_COL0], w[:, W_COLS] = row0, rows, col0, cols
    for i in range(MAX_WAITS):
        w[:, W_WAIT0 + 2 * i] = NO_COUNTER
    for i, (c, t) in enumerate(waits):
        w[:, W_WAIT0 + 2 * i], w[:, W_WAIT0 + 2 * i + 1] = c, t
    w[:, W_SIGNAL], w[:, W_SIGNAL_SCOPE], w[:, W_SIGNAL_RANK], w[:, W_SIGNAL_COUNT] = signal, int(scope), srank, count
    for word, v in (args or {}).items():
        w[:, word] = v
    groups.append(_Group(w, stage, block))


# L2 prefetches are queued a quarter stage after the attention reduces (before O_PROJ); each
# instruction covers about L2_PREFETCH_BYTES of weights
L2_PREFETCH_STAGE_OFFSET = 0.25
L2_PREFETCH_BYTES = 512 << 10


def _emit_l2_prefetch(groups: list, stage: float, block: int, budget: int, weights,
                      skip: int = 0) -> None:
    """L2_PREFETCH instructions of at most `budget` bytes over `weights`, in order. Per (opcode,
    rows, K slice bounds): every row's first columns of each K slice after its first `skip`
    (those the GEMM's early weight loads take), as many in each slice (a split tile streams its
    K slice from the start), up to the slice's end, on 16-byte granules (a weight whose slices
    do not start on one is skipped)."""
    gr = pf.GRANULE
    for op, n_rows, bounds in weights:
        starts = bounds[:-1] + np.minimum(skip, np.diff(bounds))
        widths = bounds[1:] - starts
        if (starts % gr).any() or not widths.any():
            continue
        cols = min(int(widths.max()), budget // (2 * n_rows * int((widths > 0).sum())) // gr * gr)
        if cols <= 0:
            return
        for k0, w in zip(starts.tolist(), widths.tolist()):
            if w == 0:
                continue
            k1 = k0 + min(cols, w)
            per = max(1, L2_PREFETCH_BYTES // (2 * (k1 - k0)))
            c0 = np.arange(0, n_rows, per)
            _emit(groups, stage, Op.L2_PREFETCH, np.full(len(c0), block), row0=0, rows=0,
                  col0=c0, cols=np.minimum(per, n_rows - c0),
                  args={pf.A_WOP: int(op), pf.A_K0: k0, pf.A_K1: k1})
            budget -= 2 * n_rows * (k1 - k0)


def reduce_slice_count(rows, slice_rows):
    """SPLITK_REDUCE instructions of a split tile of `rows` rows cut into slices of slice_rows
    (0: one, the whole tile); the planner's counter targets and _emit_gemm both count this way."""
    rows, h = np.asarray(rows), np.asarray(slice_rows)
    return np.where(h > 0, -(-rows // np.maximum(h, 1)), 1)


# a split output tile's SPLITK_REDUCE is queued half a stage after its split tiles: after every one
# of them in each policy's order, before the op's consumers (the next stage)
REDUCE_STAGE_OFFSET = 0.5


def _emit_gemm(groups: list, stage: int, op: int, block, *, nsplit: int, k_bounds, k_word: int,
               sk_ids, stride: int, row0, rows, col0, cols, waits=(), signal=NO_COUNTER,
               scope=SignalScope.LOCAL, srank=0, args: dict, reduce_rows=0,
               fold=False, short_last=False, row_scale_wait=None) -> None:
    """GEMM tiles of `op`: unsplit (nsplit <= 1: as `_emit`), or per output tile nsplit split
    tiles (tile-major; the tile's waits, or per split where a wait's counters and targets are
    [m, nsplit] arrays; each signals the tile's counter sk_ids) and its SPLITK_REDUCE
    (waits sk_ids = nsplit, sends the unsplit tile's signal): one, or with reduce_rows > 0 (a
    value, or one per tile) one per slice of at most reduce_rows of the tile's rows, each sending
    that signal. fold: no reduce; every split tile sends the unsplit tile's signal (the
    instruction that waits on it finishes the tiles: a folded RMSNORM). short_last: the tiles'
    last (short) slices are queued after every other split tile (PlanConfig.uneven_split).
    row_scale_wait: (counter, target), one per output tile, of the row-scale RMSNORM whose
    ROW_SCALE rows the reduce multiplies its sums by (PlanConfig.norm_fold), or an unsplit
    tile its accumulators, after waiting for it in its epilogue (norm_fold=2), or SELF_SCALED
    (unsplit tiles under norm_fold=3: their own statistic), or a RowParts (norm_fold=4: the
    ROW_PART set its writers fill, which an unsplit tile or the split tiles' reduce scales its
    rows from), else None."""
    if nsplit <= 1:
        if row_scale_wait is SELF_SCALED:
            # unsplit under norm_fold=3: the tile's own statistic, no wait
            args = {**args, mc.A_EPI_WAIT: mc.SELF_SCALE, mc.A_EPI_TARGET: 0}
        elif isinstance(row_scale_wait, RowParts):
            # unsplit under norm_fold=4: the statistic from h's writers' ROW_PART sums, no wait
            args = {**args, mc.A_EPI_WAIT: mc.ROW_PARTS, mc.A_EPI_TARGET: row_scale_wait.base}
        elif row_scale_wait is not None:
            # unsplit under norm_fold=2: the tile scales its rows itself, after its epilogue wait
            c, t = row_scale_wait
            args = {**args, mc.A_EPI_WAIT: np.asarray(c) + 1, mc.A_EPI_TARGET: t}
        _emit(groups, stage, op, block, row0=row0, rows=rows, col0=col0, cols=cols, waits=waits,
              signal=signal, scope=scope, srank=srank, args=args)
        return
    m = len(np.asarray(block))

    def rep(v):
        return np.repeat(np.broadcast_to(np.asarray(v), (m,)), nsplit)

    def rep_wait(v):
        # [m, nsplit]: one value per split tile (DOWN's slice waits), else one per output tile
        a = np.asarray(v)
        return a.reshape(-1) if a.ndim == 2 else rep(v)
    j = np.tile(np.arange(nsplit), m)
    split_args = {word: rep(v) for word, v in args.items()}
    split_args.update({k_word: np.diff(k_bounds)[j], mc.A_NSPLIT: nsplit, mc.A_SPLIT_J: j,
                       mc.A_K0: k_bounds[:-1][j], mc.A_SPLIT_ROW: stride})
    _emit(groups, stage, op, rep(block), row0=rep(row0), rows=rep(rows), col0=rep(col0),
          cols=rep(cols), waits=[(rep_wait(c), rep_wait(t)) for c, t in waits],
          signal=rep(signal) if fold else rep(sk_ids), args=split_args)
    if short_last:
        order = np.argsort(j == nsplit - 1, kind="stable")
        last = groups[-1]
        groups[-1] = _Group(last.words[order], last.stage, last.block[order])
    if fold:
        return
    if isinstance(row_scale_wait, RowParts):
        # norm_fold=4: the reduce scales its rows from ROW_PART, no norm to wait for
        red_args = sk.reduce_words(op, nsplit, stride, args, row_part=row_scale_wait.base)
        rs_c, rs_t = None, None
    else:
        red_args = sk.reduce_words(op, nsplit, stride, args,
                                   row_scale=row_scale_wait is not None)
        rs_c, rs_t = row_scale_wait if row_scale_wait is not None else (None, None)
    if np.any(reduce_rows):
        # tile i's slices k: rows [row0_i + k * h_i, ...), every other word the tile's
        row0_i = np.broadcast_to(np.asarray(row0), (m,))
        rows_i = np.broadcast_to(np.asarray(rows), (m,))
        h_i = np.broadcast_to(np.asarray(reduce_rows), (m,))
        nsl = reduce_slice_count(rows_i, h_i)
        i = np.repeat(np.arange(m), nsl)
        k = np.arange(len(i)) - np.repeat(np.cumsum(nsl) - nsl, nsl)

        def take(v):
            return np.broadcast_to(np.asarray(v), (m,))[i]
        row0 = row0_i[i] + k * h_i[i]
        rows = np.minimum(h_i[i], row0_i[i] + rows_i[i] - row0)
        block, col0, cols, sk_ids, signal, srank = (take(v) for v in
                                                    (block, col0, cols, sk_ids, signal, srank))
        red_args = {word: take(v) for word, v in red_args.items()}
        if rs_c is not None:
            rs_c, rs_t = take(rs_c), take(rs_t)
    red_waits = [(sk_ids, nsplit)] + ([(rs_c, rs_t)] if rs_c is not None else [])
    _emit(groups, stage + REDUCE_STAGE_OFFSET, Op.SPLITK_REDUCE, block, row0=row0, rows=rows,
          col0=col0, cols=cols, waits=red_waits, signal=signal, scope=scope, srank=srank,
          args=red_args)


def _column_tiles(model: ModelConfig, parallel: ParallelConfig, tl: tiles.StepTiles) -> dict:
    """Each split-K op's output column tiles in one token block: {op: (col0, width, aux)} arrays,
    aux = QKV_ROPE's section (0 q, 1 k, 2 v), O_PROJ / DOWN's owner rank slice."""
    D, n = model.head_dim, parallel.tp_size
    hq, hkv = parallel.heads_local(model), parallel.kv_heads_local(model)
    sec_c0, sec_w, sec_id = [], [], []
    for sec, (c0, width) in enumerate(((0, hq * D), (hq * D, hkv * D), ((hq + hkv) * D, hkv * D))):
        st, wd, _ = _tiles(width, tl.qkv)
        sec_c0 += list(c0 + st)
        sec_w += list(wd)
        sec_id += [sec] * len(st)
    return {Op.QKV_ROPE: (np.array(sec_c0), np.array(sec_w), np.array(sec_id)),
            Op.O_PROJ: _tiles(model.hidden_size, tl.o, n),
            Op.DOWN: _tiles(model.hidden_size, tl.down, n),
            Op.GATE_UP: _tiles(parallel.intermediate_local(model), tl.mlp)}


def _gemm_k(model: ModelConfig, parallel: ParallelConfig) -> dict:
    """K of each split-K op at one rank."""
    H, D = model.hidden_size, model.head_dim
    return {Op.QKV_ROPE: H, Op.O_PROJ: parallel.heads_local(model) * D, Op.GATE_UP: H,
            Op.DOWN: parallel.intermediate_local(model)}


@functools.lru_cache(maxsize=64)
def auto_splitk_rows(cfg: PlanConfig, kernel: KernelConfig, model: ModelConfig,
                     parallel: ParallelConfig) -> int:
    """SPLITK rows that auto split-K needs at most: max over step sizes T up to the largest cap
    of T x the step's largest split factor (a step of T rows writes split j's partials at SPLITK
    rows j * T + row). Each op's factor keeps its tiles x nsplit within num_sms, so this is a
    few thousand rows where max_split x the cap would be 16 x 1024."""
    cap = min(cfg.splitk_token_cap(), kernel.max_batch_tokens)
    gemm_k = _gemm_k(model, parallel)
    per_block = {}                  # (token_block, tile widths) -> tiles per block of each op
    rows = 0
    for T in range(1, cap + 1):
        tl = cfg.step_tiles(T, 1, model, kernel)
        key = (tl.token_block, tl.qkv, tl.o, tl.mlp, tl.down)
        if key not in per_block:
            per_block[key] = {op: len(c[0]) for op, c in _column_tiles(model, parallel, tl).items()}
        nb = -(-T // tl.token_block)
        ns = cfg.split_factors(T, {op: nb * c for op, c in per_block[key].items()}, gemm_k)
        rows = max(rows, max(ns.values()) * T if max(ns.values()) > 1 else 0)
    return rows


@functools.lru_cache(maxsize=64)
def row_parts_planned(cfg: PlanConfig, kernel: KernelConfig, model: ModelConfig,
                      parallel: ParallelConfig, lo: int, hi: int) -> bool:
    """Whether cfg may plan ROW_PART (norm_fold=4: an O_PROJ or DOWN that does not split, at TP
    1) in some step of lo..hi token rows: the megakernel variant of an M class compiles the
    ROW_PART code only then (at 70B TP8 in 65..128 tokens both split and the plans are
    norm_fold=2's; up to 64 they are whole m64n64 tiles since session 64).
    Conservative: the writers' 64-column alignment, the planner's last condition, is not asked."""
    if cfg.norm_fold != 4 or parallel.tp_size != 1:
        return False
    writers = (Op.O_PROJ, Op.DOWN)
    gemm_k = _gemm_k(model, parallel)
    for T in range(max(lo, 1), min(hi, kernel.max_batch_tokens) + 1):
        if T > min(cfg.splitk_token_cap(op) for op in writers):
            return True
        tl = cfg.step_tiles(T, 1, model, kernel)
        nb = -(-T // tl.token_block)
        ntiles = {op: nb * len(c[0]) for op, c in _column_tiles(model, parallel, tl).items()}
        nsplit = cfg.split_factors(T, ntiles, gemm_k)
        if any(nsplit[op] <= 1 for op in writers):
            return True
    return False


def _tiles(width: int, tile: int, slices: int = 1):
    """Column tiles [c0, c0+w) of `width` split in `slices` equal slices, no tile crossing one."""
    sl = width // slices
    starts, widths, owner = [], [], []
    for s in range(slices):
        for c in range(0, sl, tile):
            starts.append(s * sl + c)
            widths.append(min(tile, sl - c))
            owner.append(s)
    return np.array(starts), np.array(widths), np.array(owner)


def _grid(nb: int, ntiles: int):
    """(block, tile) index arrays of an nb x ntiles grid, block-major."""
    return np.repeat(np.arange(nb), ntiles), np.tile(np.arange(ntiles), nb)


# the GEMM tiles that op_major's raster_blocks queues column by column
RASTER_OPS = (Op.QKV_ROPE, Op.O_PROJ, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)


def _run_position(gid: np.ndarray, block: np.ndarray, seq: np.ndarray):
    """Each instruction's place in its (group, block) run (0, 1, ...) and that run's length."""
    key = gid * (block.max() + 1) + block
    o = np.lexsort((seq, key))
    sk = key[o]
    first = np.r_[0, np.flatnonzero(sk[1:] != sk[:-1]) + 1]
    counts = np.diff(np.r_[first, len(sk)])
    pos, length = np.empty(len(sk), np.int64), np.empty(len(sk), np.int64)
    pos[o] = np.arange(len(sk)) - np.repeat(first, counts)
    length[o] = np.repeat(counts, counts)
    return pos, length


def _order(groups: list, policy: str, stage_count: int, raster: int = 1,
           attn_lpt: int = 0) -> np.ndarray:
    """Concatenate the groups in the queue order of `policy` (op_major: a GEMM's tiles of each
    `raster` consecutive token blocks column by column, see PlanConfig.raster_blocks; with
    attn_lpt the attention stage in its group's order, which plan_step sorts longest first)."""
    words = np.concatenate([g.words for g in groups])
    stage = np.concatenate([np.full(len(g.block), g.stage) for g in groups])
    block = np.concatenate([g.block for g in groups])
    gid = np.concatenate([np.full(len(g.block), i) for i, g in enumerate(groups)])
    seq = np.arange(len(block))
    if policy == "op_major" and attn_lpt:
        # every ATTENTION instruction of a layer waits on earlier stages only (QKV tiles, joins),
        # so any order within its stage stays topological
        block = np.where(stage == S_ATTN, 0, block)
    if policy == "op_major" and raster > 1:
        # a GEMM tile's place in its (group, block) run is its column tile (and split)
        pos, _ = _run_position(gid, block, seq)
        pos[~np.isin(words[:, W_OPCODE], [int(x) for x in RASTER_OPS])] = 0
        idx = np.lexsort((seq, block, pos, block // raster, stage))
    elif policy == "op_major":
        idx = np.lexsort((seq, block, stage))
    elif policy == "block_major":
        idx = np.lexsort((seq, stage, block))
    else:
        # position of each instruction within its (group, block) run, as a fraction of the run
        pos, length = _run_position(gid, block, seq)
        idx = np.lexsort((seq, stage, pos / length, block + stage))
    return words[idx]


# Stages (the pipeline order within a layer)
(S_NORM_A, S_QKV, S_JOIN, S_ATTN, S_ATTN_RED, S_O, S_O_RED, S_NORM_M, S_GU, S_DOWN,
 S_D_RED) = range(11)
NUM_STAGES = 11


class Planner:
    """plan_step with a reusable output arena (no fresh 10-100 MB allocation per step), and a fast
    path for the steps of a generation loop: when a batch has the previous plan's structure (the
    same sequences' token counts and page-table lengths, every attention segment split the same
    way; decode steps between KV-split boundaries), only the ATTENTION words that depend on the
    positions (pos0, kv1, new0) are rewritten in the previous stream, and the metadata is rebuilt:
    the stream equals plan_step's bitwise (tests/test_plan.py), at a fraction of its host time.

    The stream of a returned plan is a view of the arena: valid until the next `plan` call."""

    def __init__(self, model: ModelConfig, parallel: ParallelConfig = ParallelConfig(),
                 kernel: KernelConfig = KernelConfig(), cfg: PlanConfig = PlanConfig(),
                 fast_path: bool = True):
        parallel.validate_for(model)
        cfg.validate_for(model)
        self.model, self.parallel, self.kernel, self.cfg = model, parallel, kernel, cfg
        self._arena = np.empty((0, INSTR_WORDS), np.int32)
        self.fast_path = fast_path
        # KV groups per attention segment (spread_kv_splits counts a segment's instructions)
        hkv = parallel.kv_heads_local(model)
        self._ngrp = -(-hkv // min(cfg.attn_kv_heads, hkv))
        self._last = None           # (structure key, plan, attention rows and their words)
        self.fast_plans = 0         # plans made by the fast path (for tests and benchmarks)
        self._serial = 0            # full plans made (StepPlan.serial)

    def _out(self, n: int) -> np.ndarray:
        if self._arena.shape[0] < n:
            self._arena = np.empty((int(n * 1.25) + 1024, INSTR_WORDS), np.int32)
        return self._arena[:n]

    def plan(self, batch: StepBatch, validate: bool = True) -> StepPlan:
        if self.fast_path and self._last is not None:
            meta = build_meta(batch, self.kernel, validate)
            plan = self._advance(meta)
            if plan is not None:
                self.fast_plans += 1
                return plan
        plan = plan_step(batch, self.model, self.parallel, self.kernel, self.cfg, validate=validate,
                         _alloc=self._out)
        self._serial += 1
        plan.serial = self._serial
        if self.fast_path:
            self._remember(plan)
        return plan

    @staticmethod
    def _structure(meta: StepMeta) -> tuple:
        # what fixes every word but the attention's position words: the token rows of each
        # sequence (tiles, blocks, segments, norms, LM rows) and the metadata layout (page-table
        # offsets; plus the step's sizes)
        return (meta.num_tokens, meta.num_seqs, meta.seq_rows.tobytes(), meta.page_off.tobytes(),
                int(meta.tensor.numel()))

    def _remember(self, plan: StepPlan) -> None:
        # attention lives in the layer template only: its rows j of layer 0, patched in every
        # layer at once through the [L, per_layer] view of the body
        t = plan.layout["template"]
        self._body = (t["prelude"], plan.layout["num_layers"], t["per_layer"])
        pre, L, m = self._body
        first = plan.instrs.numpy()[pre:pre + m]
        j = np.flatnonzero(first[:, W_OPCODE] == int(Op.ATTENTION))
        a = first[j]
        # the instructions' units: each instruction's first, then the second of the paired ones
        # (its sequence: the one whose rows hold its row)
        paired = np.flatnonzero(a[:, at.A_MODE] == at.MODE_PAIR)
        row0_b = a[paired, at.A_ROW0_B].astype(np.int64)
        seq_b = np.searchsorted(plan.meta.seq_row0, row0_b, side="right") - 1
        seq = np.r_[a[:, at.A_SEQ].astype(np.int64), seq_b]
        row0 = np.r_[a[:, W_ROW0].astype(np.int64), row0_b]
        nrows = np.r_[a[:, W_ROWS].astype(np.int64), np.ones(len(paired), np.int64)]
        kv0 = np.r_[a[:, at.A_KV0].astype(np.int64), a[paired, at.A_KV0].astype(np.int64)]
        # a unit's segment (a sequence's rows in one token block): plan_step sizes the splits and
        # the A_KV1 of a prompt segment cut into row chunks (PlanConfig.attn_chunk_rows) by the
        # whole segment, not by the chunk
        B = plan.tiles.token_block
        _, seg_of = np.unique(np.stack([seq, row0 // B]), axis=1, return_inverse=True)
        seg_of = seg_of.reshape(-1)
        seg_r0 = np.full(int(seg_of.max()) + 1 if len(seq) else 0, np.iinfo(np.int64).max)
        np.minimum.at(seg_r0, seg_of, row0)
        seg_seq = np.zeros(len(seg_r0), np.int64)
        seg_seq[seg_of] = seq
        self._last = dict(key=self._structure(plan.meta), plan=plan, rows=j, paired=paired,
                          seq=seq, row0=row0, nrows=nrows, kv0=kv0, seg_of=seg_of,
                          seg_r0=seg_r0, seg_seq=seg_seq,
                          words=a[:, ADV_WORD0:ADV_WORD1].copy(),
                          cost=self._lpt_cost(a.astype(np.int64)))
        self._last["split"] = self._splits(plan.meta, self._last)

    def _lpt_cost(self, a: np.ndarray) -> np.ndarray | None:
        """PlanConfig.attn_lpt: the estimated costs of attention words `a` (rows of the layer
        template), which fix their queue order in a step with prompt chunks; None when they do
        not (attn_lpt off, a decode-only step)."""
        if not self.cfg.attn_lpt or not (a[:, W_ROWS] > 1).any():
            return None
        return at.est_cost_ns(a[:, at.A_MODE], a[:, W_ROWS], a[:, at.A_QPK], a[:, at.A_POS0],
                              a[:, at.A_KV0], a[:, at.A_KV1], a[:, at.A_POS0_B])

    def _splits(self, meta: StepMeta, last: dict) -> tuple[np.ndarray, np.ndarray]:
        """(keys per split, splits) of each attention unit's segment at meta's positions, as
        plan_step sizes them (spread_kv_splits over the step's segments)."""
        row0, nrows, seg_of = last["row0"], last["nrows"], last["seg_of"]
        rows_end = np.zeros(len(last["seg_r0"]), np.int64)
        np.maximum.at(rows_end, seg_of, row0 + nrows)
        s_seq = last["seg_seq"]
        ctx = meta.seq_start[s_seq] + (rows_end - meta.seq_row0[s_seq])
        size = self.cfg.spread_kv_splits(rows_end - last["seg_r0"], ctx, self._ngrp)
        return size[seg_of], -(-ctx[seg_of] // size[seg_of])

    def _advance(self, meta: StepMeta) -> StepPlan | None:
        """The previous plan with meta's positions, or None when the structure differs."""
        last = self._last
        if self._structure(meta) != last["key"]:
            return None
        seq, row0, nrows = last["seq"], last["row0"], last["nrows"]
        size, nsplit = self._splits(meta, last)
        # the same splits of the same size: only the positions move (a new size moves every
        # split's first key, A_KV0)
        if not (np.array_equal(size, last["split"][0]) and np.array_equal(nsplit, last["split"][1])):
            return None
        # plan_step's segment words (seg_pos0, a_kv1, A_NEW0) for the new positions
        new0 = meta.seq_start[seq]
        pos0 = new0 + (row0 - meta.seq_row0[seq])
        seg_end = np.zeros(len(last["seg_r0"]), np.int64)
        np.maximum.at(seg_end, last["seg_of"], pos0 + nrows)
        kv1 = np.minimum(last["kv0"] + size, seg_end[last["seg_of"]])
        prev = last["plan"]
        pre, L, m = self._body
        # the words A_POS0 .. A_NEW0_B of the attention rows (the same in every layer), the ones
        # that move set to the new positions
        block = last["words"].copy()
        n, pb = len(last["rows"]), last["paired"]
        for word, v in ((at.A_POS0, pos0[:n]), (at.A_KV1, kv1[:n]), (at.A_NEW0, new0[:n])):
            block[:, word - ADV_WORD0] = v
        for word, v in ((at.A_POS0_B, pos0[n:]), (at.A_NEW0_B, new0[n:])):
            block[pb, word - ADV_WORD0] = v
        if last["cost"] is not None:
            # attn_lpt orders the attention by cost: the stream holds only while no cost moves
            words = np.zeros((len(block), INSTR_WORDS), np.int64)
            words[:, W_ROWS], words[:, ADV_WORD0:ADV_WORD1] = nrows[:n], block
            if not np.array_equal(self._lpt_cost(words), last["cost"]):
                return None
        adv = StreamAdvance(pre, L, m, last["rows"], ADV_WORD0, block)
        adv.apply_host(prev.instrs.numpy())
        return StepPlan(prev.instrs, meta, prev.targets, prev.rank, prev.tp, prev.hidden_slice,
                        prev.layout, prev.tiles, serial=prev.serial, advance=adv)


def plan_step(batch: StepBatch, model: ModelConfig, parallel: ParallelConfig = ParallelConfig(),
              kernel: KernelConfig = KernelConfig(), cfg: PlanConfig = PlanConfig(),
              validate: bool = True, _alloc=None) -> StepPlan:
    if validate and _alloc is None:
        parallel.validate_for(model)
        cfg.validate_for(model)
    meta = build_meta(batch, kernel, validate)
    n, rank = parallel.tp_size, parallel.rank
    T, S = meta.num_tokens, meta.num_seqs
    tl = cfg.step_tiles(T, S, model, kernel)
    B = tl.token_block
    TM = kernel.max_batch_tokens
    H, D, L = model.hidden_size, model.head_dim, model.num_layers
    hq, hkv = parallel.heads_local(model), parallel.kv_heads_local(model)
    qpk = hq // hkv
    I_loc, V_loc = parallel.intermediate_local(model), parallel.vocab_local(model)
    nb = -(-T // B)
    blocks = np.arange(nb)
    brow0 = blocks * B
    brows = np.minimum(B, T - brow0)
    slice_w = H // n
    if H % n:
        raise ValueError(f"TP size {n} does not divide hidden_size {H}")

    # tiles ----------------------------------------------------------------------------------------
    ct = _column_tiles(model, parallel, tl)
    (qkv_c0, qkv_w, qkv_sec), (o_c0, o_w, o_own) = ct[Op.QKV_ROPE], ct[Op.O_PROJ]
    (d_c0, d_w, d_own), (g_c0, g_w, _) = ct[Op.DOWN], ct[Op.GATE_UP]
    qkv_base = np.array([0, hq * D, (hq + hkv) * D])[qkv_sec]
    n_qkv, n_o, n_d, n_g = len(qkv_c0), len(o_c0), len(d_c0), len(g_c0)

    # split-K: nsplit per op, the SK counters of its split output tiles (tile b * ntiles + t)
    ntiles = {Op.QKV_ROPE: n_qkv, Op.O_PROJ: n_o, Op.GATE_UP: n_g, Op.DOWN: n_d}
    gemm_k = _gemm_k(model, parallel)
    nsplit = cfg.split_factors(T, {op: nb * c for op, c in ntiles.items()}, gemm_k)
    sk_off, sk_count = {}, 0
    for op in ntiles:
        if nsplit[op] > 1:
            sk_off[op] = sk_count
            sk_count += nb * ntiles[op]
    if sk_count and max(nsplit.values()) * T > cfg.splitk_rows(kernel, model, parallel):
        raise ValueError(f"split-K of a {T}-token step needs {max(nsplit.values()) * T} SPLITK rows, "
                         f"the workspace has {cfg.splitk_rows(kernel, model, parallel)}")

    # segments: the rows of one sequence inside one block ---------------------------------------
    r0s, lens = meta.seq_row0, meta.seq_rows
    b_first = r0s // B
    b_last = (r0s + lens - 1) // B
    nseg_s = b_last - b_first + 1
    seg_seq = np.repeat(np.arange(S), nseg_s)
    seg_first = np.zeros(S, np.int64)
    np.cumsum(nseg_s[:-1], out=seg_first[1:])
    seg_k = np.arange(len(seg_seq)) - seg_first[seg_seq]         # index within its sequence
    seg_blk = b_first[seg_seq] + seg_k
    seg_r0 = np.maximum(r0s[seg_seq], seg_blk * B)
    seg_r1 = np.minimum(r0s[seg_seq] + lens[seg_seq], (seg_blk + 1) * B)
    seg_rows = seg_r1 - seg_r0
    seg_pos0 = meta.seq_start[seg_seq] + (seg_r0 - r0s[seg_seq])
    seg_ctx = seg_pos0 + seg_rows
    gh = min(cfg.attn_kv_heads, hkv)
    grp_c0 = np.arange(0, hkv, gh)
    grp_w = np.minimum(gh, hkv - grp_c0)
    ngrp = len(grp_c0)
    seg_kv = cfg.spread_kv_splits(seg_rows, seg_ctx, ngrp)      # keys per split
    seg_nsplit = -(-seg_ctx // seg_kv)
    seg_is_first = seg_k == 0
    seg_is_last = seg_k == nseg_s[seg_seq] - 1
    nseg = len(seg_seq)
    split = seg_nsplit > 1
    # ATTENTION instructions per (segment, group, split): row chunks of long prefill segments.
    # A split segment stays whole unless attn_chunk_splits: a chunk whose rows all precede a
    # split's first key then has no key in it and writes o = 0, lse = -inf (the split's
    # ATTN_REDUCE reads a partial per row from every split)
    chunk_h = cfg.attn_chunk_for(qpk)
    chunkable = np.ones(len(seg_seq), bool) if cfg.attn_chunk_splits else ~split
    seg_nchunk = (np.where(chunkable, np.maximum(1, -(-seg_rows // chunk_h)), 1) if chunk_h
                  else np.ones(len(seg_seq), np.int64))
    # ATTN_REDUCE instructions (and SPLIT counters) per split segment: one, or one per chunk
    seg_nred = np.where(split, seg_nchunk if cfg.attn_chunk_reduce else 1, 0)
    slot_need = np.where(split, seg_rows * seg_nsplit, 0)
    seg_slot = np.zeros(nseg, np.int64)
    np.cumsum(slot_need[:-1], out=seg_slot[1:])
    P = cfg.max_partial_rows(kernel)
    if nseg and int(seg_slot[-1] + slot_need[-1]) > P:
        raise ValueError(f"attention splits need {int(seg_slot[-1] + slot_need[-1])} ATTN_PARTIAL "
                         f"rows, the buffer has {P} (raise PlanConfig.kv_split or partial_rows)")

    # counter layout -------------------------------------------------------------------------------
    # DOWN's slice waits (PlanConfig.down_slice_waits): GU counters per (block, DOWN K slice);
    # each GATE_UP tile signals the counter of the slice its MLP_ACT columns lie in
    # (only where GATE_UP does not split: its partials and DOWN's share the SPLITK workspace, so
    # a DOWN split tile may not start while GATE_UP reduces of other slices still read theirs)
    gu_slices = (nsplit[Op.DOWN] if cfg.down_slice_waits and nsplit[Op.DOWN] > 1
                 and nsplit[Op.GATE_UP] == 1 else 1)
    g_slice = np.zeros(n_g, np.int64)
    if gu_slices > 1:
        d_kb = cfg.op_k_slices(T, nb * n_d, I_loc, gu_slices)
        g_slice = np.searchsorted(d_kb, g_c0, side="right") - 1
        if (g_c0 + g_w > d_kb[g_slice + 1]).any():
            raise ValueError(f"PlanConfig.down_slice_waits: GATE_UP tiles of {int(g_w.max())} "
                             f"columns straddle DOWN's K slices {d_kb.tolist()} (a tile must lie "
                             f"in one slice; set down_slice_waits=0 or another mlp_tile)")
    names = ["NA", "QKV", "ATTN", "ORS", "HA", "NM", "GU", "DRS", "HM"]
    groups_layout, off = {}, 0
    for nm in names:
        size = nb * gu_slices if nm == "GU" else nb
        groups_layout[nm] = (off, size)
        off += size
    # JOIN counters only for segments followed by another of their sequence, SPLIT counters only
    # for split segments
    join_id = np.cumsum(~seg_is_last) - 1                         # valid where ~seg_is_last
    # a split segment's first SPLIT counter (one per ATTN_REDUCE: seg_nred); valid where split
    split_id = np.cumsum(seg_nred) - seg_nred
    groups_layout["JOIN"] = (off, int((~seg_is_last).sum()))
    off += groups_layout["JOIN"][1]
    groups_layout["SPLIT"] = (off, int(seg_nred.sum()))
    off += groups_layout["SPLIT"][1]
    groups_layout["SK"] = (off, sk_count)
    off += sk_count
    CPL = off
    C = {nm: groups_layout[nm][0] + CPL for nm in groups_layout}    # absolute ids of layer 0
    prev_HM = groups_layout["HM"][0]                                  # block 0 = prelude
    tp1 = n == 1
    # O_PROJ's reduce folded into the MLP norm (PlanConfig.fold_o_reduce; TP 1, where it splits)
    fold_o = bool(cfg.fold_o_reduce) and tp1 and nsplit[Op.O_PROJ] > 1
    # DOWN's folded into the next layer's attention norm (PlanConfig.fold_down_reduce)
    fold_d = bool(cfg.fold_down_reduce) and tp1 and nsplit[Op.DOWN] > 1

    red_h = {op: cfg.reduce_slice_rows(op, T, brows, ntiles[op], nsplit[op], tp1)
             for op in ntiles}
    # SPLITK_REDUCE instructions per split output tile in each block (1: whole tiles)
    red_sl = {op: reduce_slice_count(brows, h) for op, h in red_h.items()}
    # signals per block of each counter that consumers wait for (a split tile's reduce slices
    # each signal; at TP > 1 the hidden rows' counters count TP_REDUCEs, one per rank)
    qkv_target = n_qkv * red_sl[Op.QKV_ROPE]
    gu_target = n_g * red_sl[Op.GATE_UP]
    # per (block, DOWN K slice): the signals of the slice's GATE_UP tiles
    gu_slice_target = np.bincount(g_slice, minlength=gu_slices)[None, :] * red_sl[Op.GATE_UP][:, None]
    hid_a_target = n_o * red_sl[Op.O_PROJ] if tp1 else np.full(nb, n)
    if fold_o:
        hid_a_target = np.full(nb, n_o * nsplit[Op.O_PROJ])     # every split tile signals
    hid_m_target = n_d * red_sl[Op.DOWN] if tp1 else np.full(nb, n)
    if fold_d:
        hid_m_target = np.full(nb, n_d * nsplit[Op.DOWN])
    # signals per block of one DOWN tile (or of one EMBED tile of the prelude, on the DOWN grid):
    # its reduce slices, or with the fold its split tiles
    down_tile_signals = np.full(nb, nsplit[Op.DOWN]) if fold_d else red_sl[Op.DOWN]

    attn_target = np.zeros(nb, np.int64)
    np.add.at(attn_target, seg_blk, np.where(split, seg_nred, ngrp * seg_nchunk))

    def gemm(stage, op, b, t, k_word, **kw):
        """_emit_gemm of tiles (block b, column tile t) of op with the step's split (kw may carry
        row_scale_wait, a function of the tiles' blocks: norm_fold's)."""
        if callable(kw.get("row_scale_wait")):
            kw["row_scale_wait"] = kw["row_scale_wait"](b)
        ns = nsplit.get(op, 1)
        sk_ids = C["SK"] + sk_off[op] + b * ntiles[op] + t if ns > 1 else None
        if ns > 1 and op == Op.GATE_UP:
            kw["args"] = {**kw["args"], mm.A_UP_COL: I_loc}
        uneven = ns > 1 and cfg.uneven_split(T, nb * ntiles[op], gemm_k[op]) is not None
        _emit_gemm(g, stage, op, b, nsplit=ns,
                   k_bounds=cfg.op_k_slices(T, nb * ntiles[op], gemm_k[op], ns) if ns > 1
                   else None, k_word=k_word, sk_ids=sk_ids, stride=T, short_last=uneven,
                   reduce_rows=red_h[op][b],
                   fold=(fold_o and op == Op.O_PROJ) or (fold_d and op == Op.DOWN), **kw)

    # norms: row groups of at most norm_rows rows inside each block, all signalling the block
    norm_rows = cfg.norm_rows_for(T)
    ngr = -(-brows // norm_rows)
    nr_blk = np.repeat(blocks, ngr)
    nr_k = np.arange(len(nr_blk)) - np.repeat(np.cumsum(ngr) - ngr, ngr)
    nr_row0 = brow0[nr_blk] + nr_k * norm_rows
    nr_rows = np.minimum(norm_rows, brow0[nr_blk] + brows[nr_blk] - nr_row0)

    def norm(stage, wait_c, wait_t, sig_c, which, fold_nsplit=0, scale_only=False):
        args = {rw.A_SRC: Buf.HIDDEN, rw.A_DST: Buf.ROW_SCALE if scale_only else Buf.NORMED,
                rw.A_NORM_WEIGHT: which}
        if fold_nsplit:
            # the split tiles' partials are at SPLITK rows j * T + row (gemm's stride)
            args.update({rw.A_RED_NSPLIT: fold_nsplit, rw.A_RED_STRIDE: T})
        _emit(g, stage, Op.RMSNORM, nr_blk, row0=nr_row0, rows=nr_rows, col0=0, cols=H,
              waits=[(wait_c + nr_blk, wait_t[nr_blk])], signal=sig_c + nr_blk, args=args)

    def folded_norm(op, norm_c, h_c, h_t, folded_reduce):
        """PlanConfig.norm_fold for the GEMM op after a norm (the norm's counter norm_c; h_c /
        h_t: the counter and targets of whoever writes the residual rows h): (src, waits of op's
        tiles, row_scale_wait) -- where op splits (norm_fold 1 or 2) or not (2) and the norm
        finishes no split reduce, op's tiles read h itself and wait for h's writer, the norm
        only writes ROW_SCALE, and op's reduces (split) or its tiles' epilogues (unsplit: the
        epilogue wait) wait for it; else the norm's output and waits (a norm that writes h,
        folded with O_PROJ's / DOWN's reduce, stays on the path whatever it writes: session
        38)). norm_fold=3 where op does not split: row_scale_wait SELF_SCALED, and the caller
        emits no norm; norm_fold=4 where op's tiles (or, split, their reduces) can be scaled
        from ROW_PART (row_parts): that set's RowParts, no norm either, elsewhere as
        norm_fold=2."""
        if not cfg.norm_fold or folded_reduce or (cfg.norm_fold == 1 and nsplit[op] <= 1):
            return Buf.NORMED, lambda b: [(norm_c + b, ngr[b])], None
        h_waits = lambda b: [(h_c + b, np.asarray(h_t)[b])]  # noqa: E731
        if cfg.norm_fold == 3 and nsplit[op] <= 1:
            return Buf.HIDDEN, h_waits, SELF_SCALED
        if op in row_parts:
            return Buf.HIDDEN, h_waits, row_parts[op]
        return Buf.HIDDEN, h_waits, lambda b: (norm_c + b, ngr[b])

    # norm_fold=4: the GEMMs after a norm whose tiles (or, split, their reduces) take their
    # rows' statistic from ROW_PART (RowParts), and the writers of h that fill that set: a GEMM
    # whose h comes from unsplit RESIDUAL tiles at TP 1 (QKV_ROPE's from DOWN's, and from
    # EMBED's in layer 0; GATE_UP's from O_PROJ's) whose columns start on ROW_PART's 64-column
    # groups
    G = mc.row_part_groups(H)
    row_parts = {}
    if cfg.norm_fold == 4 and tp1:
        for op, writer, wc0, s in ((Op.QKV_ROPE, Op.DOWN, d_c0, mc.ROW_PART_ATTN),
                                   (Op.GATE_UP, Op.O_PROJ, o_c0, mc.ROW_PART_MLP)):
            if nsplit[writer] <= 1 and not (np.asarray(wc0) % mc.ROW_PART_COLS).any():
                row_parts[op] = RowParts(s * G)

    def row_part_word(op) -> dict:
        """The A_ROW_PART word of op's h-writing tiles: 1 + the column of the set the GEMM op
        after them is scaled from, where it is (row_parts)."""
        return {mc.A_ROW_PART: 1 + row_parts[op].base} if op in row_parts else {}

    g: list = []
    qkv_src, qkv_waits, qkv_scale = folded_norm(Op.QKV_ROPE, C["NA"], prev_HM, hid_m_target,
                                                fold_d)
    if plans_norm(qkv_scale):
        norm(S_NORM_A, prev_HM, hid_m_target, C["NA"], NormWeight.ATTN,
             nsplit[Op.DOWN] if fold_d else 0, scale_only=qkv_scale is not None)
    # QKV tiles
    b, t = _grid(nb, n_qkv)
    gemm(S_QKV, Op.QKV_ROPE, b, t, qk.A_K, row0=brow0[b], rows=brows[b], col0=qkv_c0[t],
         cols=qkv_w[t], waits=qkv_waits(b), signal=C["QKV"] + b, row_scale_wait=qkv_scale,
         args={qk.A_SRC: qkv_src, qk.A_DST: Buf.Q, qk.A_SECTION: qkv_sec[t],
                qk.A_SEC_COL0: qkv_base[t], qk.A_HEAD_DIM: D, qk.A_K: H})
    # joins and attention
    seg_ids = np.arange(nseg)
    prev_join = join_id[np.maximum(seg_ids - 1, 0)] if nseg else seg_ids
    jw_prev = np.where(seg_is_first, NO_COUNTER, C["JOIN"] + prev_join)
    jw_prev_t = np.where(seg_is_first, 0, 1)
    js = seg_ids[~seg_is_last]
    _emit(g, S_JOIN, Op.NOOP, seg_blk[js], row0=seg_r0[js], rows=seg_rows[js], col0=0, cols=0,
          waits=[(C["QKV"] + seg_blk[js], qkv_target[seg_blk[js]]), (jw_prev[js], jw_prev_t[js])],
          signal=C["JOIN"] + join_id[js])
    # attention instructions: segment x group x split x row chunk (longest chunk first)
    reps = ngrp * seg_nsplit * seg_nchunk
    a_seg = np.repeat(seg_ids, reps)
    within = np.arange(len(a_seg)) - np.repeat(np.cumsum(reps) - reps, reps)
    a_grp = within // (seg_nsplit[a_seg] * seg_nchunk[a_seg])
    a_spl = within // seg_nchunk[a_seg] % seg_nsplit[a_seg]
    a_off = (seg_nchunk[a_seg] - 1 - within % seg_nchunk[a_seg]) * chunk_h   # chunk's first row
    a_rows = np.where(seg_nchunk[a_seg] > 1, np.minimum(chunk_h, seg_rows[a_seg] - a_off),
                      seg_rows[a_seg])
    a_split = split[a_seg]
    a_kv0 = a_spl * seg_kv[a_seg]
    a_kv1 = np.minimum(a_kv0 + seg_kv[a_seg], seg_ctx[a_seg])
    # decode units paired into one instruction (PlanConfig.attn_pair): the first of a pair
    # carries the second's words, the second is dropped
    a_seq = seg_seq[a_seg]
    a_mode = np.where(a_split, at.MODE_PARTIAL, at.MODE_DIRECT)
    cand = np.flatnonzero(~a_split & (seg_rows[a_seg] == 1) & (qpk <= at.PAIR_MAX_QPK))
    pa, pb = cfg.attn_pairs(cand, seg_blk[a_seg[cand]] * ngrp + a_grp[cand], seg_ctx[a_seg[cand]],
                            len(a_seg))
    pair_words = {w: np.zeros(len(a_seg), np.int64)
                  for w in (at.A_ROW0_B, at.A_POS0_B, at.A_PAGE_OFF_B, at.A_NEW0_B)}
    a_count = np.ones(len(a_seg), np.int64)
    a_mode[pa] = at.MODE_PAIR
    a_count[pa] = 2
    for w, v in ((at.A_ROW0_B, seg_r0[a_seg[pb]]), (at.A_POS0_B, seg_pos0[a_seg[pb]]),
                 (at.A_PAGE_OFF_B, meta.page_off[a_seq[pb]]),
                 (at.A_NEW0_B, meta.seq_start[a_seq[pb]])):
        pair_words[w][pa] = v
    keep = np.ones(len(a_seg), bool)
    keep[pb] = False
    # a split instruction's partial rows: split by split over the segment's rows, or with
    # attn_chunk_reduce chunk by chunk (the chunk's splits contiguous: its reduce's slots)
    if cfg.attn_chunk_reduce:
        a_red = a_off // max(chunk_h, 1)                # the chunk's reduce (and SPLIT counter)
        a_slot = seg_slot[a_seg] + a_off * seg_nsplit[a_seg] + a_spl * a_rows
    else:
        a_red = np.zeros(len(a_seg), np.int64)
        a_slot = seg_slot[a_seg] + a_spl * seg_rows[a_seg] + a_off
    per_instr = dict(block=seg_blk[a_seg], row0=seg_r0[a_seg] + a_off, rows=a_rows,
                     col0=grp_c0[a_grp], cols=grp_w[a_grp], qkv_wait=C["QKV"] + seg_blk[a_seg],
                     qkv_t=qkv_target[seg_blk[a_seg]], join=jw_prev[a_seg], join_t=jw_prev_t[a_seg],
                     signal=np.where(a_split, C["SPLIT"] + split_id[a_seg] + a_red,
                                     C["ATTN"] + seg_blk[a_seg]), count=a_count)
    args = {at.A_SEQ: a_seq, at.A_POS0: seg_pos0[a_seg] + a_off, at.A_KV0: a_kv0, at.A_KV1: a_kv1,
            at.A_PAGE_OFF: meta.page_off[a_seq], at.A_MODE: a_mode,
            at.A_SLOT: np.where(a_split, a_slot, 0), at.A_NEW0: meta.seq_start[a_seq],
            **pair_words}
    kept = np.flatnonzero(keep)
    if cfg.attn_lpt and (a_rows[kept] > 1).any():
        # prompt chunks, then decode units, each longest first (ties keep the block order);
        # _order keeps this group's order. Decode-only steps keep the block order: ordered by
        # cost, a generation loop's fast path (Planner) would re-plan whenever a unit crosses a
        # 64-key block (at B=256 nearly every step: 3.6 instead of 1.2 ms of host time a step)
        cost = at.est_cost_ns(a_mode[kept], a_rows[kept], qpk, args[at.A_POS0][kept],
                              a_kv0[kept], a_kv1[kept], pair_words[at.A_POS0_B][kept])
        decode = a_rows[kept] == 1
        # attn_lpt 2: the prompt chunks in block order (the first blocks' reduces and O_PROJ
        # tiles, queued first after the attention, are not left waiting for the shortest chunks)
        key = np.where(decode, -cost, 0) if cfg.attn_lpt == 2 else -cost
        kept = kept[np.lexsort((np.arange(len(kept)), key, decode))]
    k = {name: v[kept] for name, v in per_instr.items()}
    _emit(g, S_ATTN, Op.ATTENTION, k["block"], row0=k["row0"], rows=k["rows"], col0=k["col0"],
          cols=k["cols"], waits=[(k["qkv_wait"], k["qkv_t"]), (k["join"], k["join_t"])],
          signal=k["signal"], count=k["count"],
          args={at.A_QPK: qpk, at.A_HEAD_DIM: D, **{w: v[kept] for w, v in args.items()}})
    # ATTN_REDUCE: per split segment, or per chunk of it (attn_chunk_reduce: seg_nred of them,
    # each over its chunk's splits)
    ss = np.repeat(seg_ids, seg_nred)
    r_idx = np.arange(len(ss)) - np.repeat(np.cumsum(seg_nred) - seg_nred, seg_nred)
    r_off = r_idx * chunk_h if cfg.attn_chunk_reduce else np.zeros(len(ss), np.int64)
    r_rows = np.where(seg_nred[ss] > 1, np.minimum(chunk_h, seg_rows[ss] - r_off), seg_rows[ss])
    # every split of the reduce's rows, in every KV group (a segment's chunks signal its one)
    r_waits = ngrp * seg_nsplit[ss] * (1 if cfg.attn_chunk_reduce else seg_nchunk[ss])
    _emit(g, S_ATTN_RED, Op.ATTN_REDUCE, seg_blk[ss], row0=seg_r0[ss] + r_off, rows=r_rows,
          col0=0, cols=hkv, waits=[(C["SPLIT"] + split_id[ss] + r_idx, r_waits)],
          signal=C["ATTN"] + seg_blk[ss],
          args={at.A_SLOT0: seg_slot[ss] + r_off * seg_nsplit[ss], at.A_NSPLIT: seg_nsplit[ss],
                at.A_QPK: qpk, at.A_HEAD_DIM: D})

    # L2 prefetch of the layer's next weights by the SMs its attention leaves idle (queued after the
    # attention, before O_PROJ; no waits, no signal)
    if cfg.l2_prefetch_mib and int(keep.sum()) + len(ss) < cfg.num_sms:
        def slices(op):
            return (cfg.op_k_slices(T, nb * ntiles[op], gemm_k[op], nsplit[op]) if nsplit[op] > 1
                    else np.array([0, gemm_k[op]]))
        # queued with the last block's attention (block_major: the first block's), so that in
        # every policy's order they follow attention that leaves SMs idle and precede O_PROJ
        weights = [(Op.GATE_UP, 2 * I_loc, slices(Op.GATE_UP))]
        if cfg.l2_prefetch_o_proj:
            weights.insert(0, (Op.O_PROJ, H, slices(Op.O_PROJ)))
        _emit_l2_prefetch(g, S_ATTN_RED + L2_PREFETCH_STAGE_OFFSET,
                          0 if cfg.policy == "block_major" else nb - 1, cfg.l2_prefetch_mib << 20,
                          weights, skip=cfg.l2_prefetch_skip)

    def proj(stage, red_stage, op, src, K, tiles, wait_c, wait_t, rs, hid, residual):
        """op's tiles into HIDDEN (TP 1) or scattered to the ranks + TP_REDUCE; returns the
        tiles' argument words at TP 1 (None above)."""
        c0, wd, own = tiles
        b, t = _grid(nb, len(c0))
        if op == Op.EMBED:      # never split
            def emit(stage, op, b, **kw):
                _emit(g, stage, op, b, **kw)
        else:
            def emit(stage, op, b, **kw):
                gemm(stage, op, b, t, mm.A_K, **kw)
        common = dict(row0=brow0[b], rows=brows[b], col0=c0[t], cols=wd[t])
        targs = {mm.A_SRC: src, mm.A_K: K} if op != Op.EMBED else {}
        if wait_c is None:
            waits = []
        elif np.ndim(wait_t) == 2:
            # [block, K slice] targets: split j of a tile waits for counter (block, j)
            ns = np.asarray(wait_t).shape[1]
            waits = [(wait_c + b[:, None] * ns + np.arange(ns)[None, :], np.asarray(wait_t)[b])]
        else:
            waits = [(wait_c + b, np.asarray(wait_t)[b] if np.ndim(wait_t) else wait_t)]
        if tp1:
            epi = mm.Epi.RESIDUAL if residual else mm.Epi.STORE
            if op == Op.EMBED:
                targs.update({em.A_DST: Buf.HIDDEN, em.A_EPI: epi})
            else:
                targs.update({mm.A_DST: Buf.HIDDEN, mm.A_EPI: epi})
            # norm_fold=4: the rows' sums of squares for the GEMM after the next norm
            targs.update(row_part_word(Op.GATE_UP if op == Op.O_PROJ else Op.QKV_ROPE))
            if op == Op.EMBED:
                # the prelude's EMBED tiles stand in for the DOWN tiles the first layer's norm
                # waits for: each counts for as many signals as a DOWN tile sends
                emit(stage, op, b, waits=waits, signal=hid + b, args=targs,
                     count=down_tile_signals[b], **common)
            else:
                emit(stage, op, b, waits=waits, signal=hid + b, args=targs, **common)
            return targs
        if op == Op.EMBED:
            targs.update({em.A_DST: Buf.RECV, em.A_EPI: mm.Epi.SCATTER, em.A_SLOT_STRIDE: TM})
        else:
            targs.update({mm.A_DST: Buf.RECV, mm.A_EPI: mm.Epi.SCATTER, mm.A_SLOT_STRIDE: TM})
        emit(stage, op, b, waits=waits, signal=rs + b, scope=SignalScope.PEER, srank=own[t],
             args=targs, **common)
        _emit(g, red_stage, Op.TP_REDUCE, blocks, row0=brow0, rows=brows, col0=rank * slice_w,
              cols=slice_w, waits=[(rs + blocks, n * (len(c0) // n))], signal=hid + blocks,
              scope=SignalScope.ALL,
              args={cm.A_SRC: Buf.RECV, cm.A_DST: Buf.HIDDEN, cm.A_RESIDUAL: int(residual),
                    cm.A_SLOT_STRIDE: TM, cm.A_NRANKS: n})

    proj(S_O, S_O_RED, Op.O_PROJ, Buf.ATTN_OUT, hq * D, (o_c0, o_w, o_own), C["ATTN"], attn_target,
         C["ORS"], C["HA"], True)
    gu_src, gu_waits, gu_scale = folded_norm(Op.GATE_UP, C["NM"], C["HA"], hid_a_target, fold_o)
    if plans_norm(gu_scale):
        norm(S_NORM_M, C["HA"], hid_a_target, C["NM"], NormWeight.MLP,
             nsplit[Op.O_PROJ] if fold_o else 0, scale_only=gu_scale is not None)
    b, t = _grid(nb, n_g)
    gemm(S_GU, Op.GATE_UP, b, t, mm.A_K, row0=brow0[b], rows=brows[b], col0=g_c0[t], cols=g_w[t],
         waits=gu_waits(b), signal=C["GU"] + b * gu_slices + g_slice[t], row_scale_wait=gu_scale,
         args={mm.A_SRC: gu_src, mm.A_DST: Buf.MLP_ACT, mm.A_EPI: mm.Epi.SILU_MUL, mm.A_K: H})
    down_args = proj(S_DOWN, S_D_RED, Op.DOWN, Buf.MLP_ACT, I_loc, (d_c0, d_w, d_own), C["GU"],
                     gu_slice_target if gu_slices > 1 else gu_target, C["DRS"], C["HM"], True)
    template = _order(g, cfg.policy, NUM_STAGES, cfg.raster_blocks, cfg.attn_lpt)

    # prelude: EMBED on the DOWN grid, counters of block 0 ---------------------------------------
    g = []
    proj(S_DOWN, S_D_RED, Op.EMBED, 0, 0, (d_c0, d_w, d_own), None, 0,
         groups_layout["DRS"][0], groups_layout["HM"][0], False)
    prelude = _order(g, "op_major", NUM_STAGES)

    # final: LM_NORM per run of at most norm_rows sequences whose last rows share a block (each
    # waits for that block's last DOWN), LM_HEAD tiles ---------------------------------------------
    LMN, DONE = (L + 1) * CPL, (L + 1) * CPL + 1
    last_blk = meta.last_rows // B
    new_run = np.ones(S, bool)
    if S:
        k_in_blk = np.arange(S) - np.r_[0, np.flatnonzero(np.diff(last_blk)) + 1].repeat(
            np.diff(np.r_[0, np.flatnonzero(np.diff(last_blk)) + 1, S]))
        new_run = k_in_blk % norm_rows == 0
    first_seq = np.flatnonzero(new_run)
    ub = last_blk[first_seq]
    cnt = np.diff(np.r_[first_seq, S])
    hm_last = L * CPL + groups_layout["HM"][0]
    g = []
    lm_wait_c, lm_wait_t = hm_last + ub, hid_m_target[ub]
    if fold_d:
        # the last layer's DOWN tiles have no next norm to finish them: one SPLITK_REDUCE per
        # tile here (whole tiles, once per step), after all of its block's split tiles (the HM
        # counter), signalling the block's final counter that LM_NORM waits for
        FHM = (L + 1) * CPL + 2
        b, t = _grid(nb, n_d)
        _emit(g, 0, Op.SPLITK_REDUCE, b, row0=brow0[b], rows=brows[b], col0=d_c0[t],
              cols=d_w[t], waits=[(hm_last + b, hid_m_target[b])], signal=FHM + b,
              args=sk.reduce_words(Op.DOWN, nsplit[Op.DOWN], T, down_args))
        lm_wait_c, lm_wait_t = FHM + ub, np.full(len(ub), n_d)
    off_last = meta.word(mc.M_OFF_LAST)
    _emit(g, 1, Op.LM_NORM, ub, row0=first_seq, rows=cnt, col0=0, cols=H,
          waits=[(lm_wait_c, lm_wait_t)], signal=LMN,
          args={lmn.A_SRC: Buf.HIDDEN, lmn.A_DST: Buf.LAST_NORMED, lmn.A_LAST_OFF: off_last + first_seq,
                lmn.A_WIDTH: H})
    lm_c0, lm_w, _ = _tiles(V_loc, tl.lm)
    LB = tl.lm_block
    nsb = -(-S // LB)
    b, t = _grid(nsb, len(lm_c0))
    _emit(g, 2, Op.LM_HEAD, b, row0=b * LB, rows=np.minimum(LB, S - b * LB), col0=lm_c0[t], cols=lm_w[t],
          waits=[(LMN, len(ub))], signal=DONE,
          args={mm.A_SRC: Buf.LAST_NORMED, mm.A_DST: Buf.LOGITS, mm.A_EPI: mm.Epi.STORE, mm.A_K: H})
    final = _order(g, "op_major", 3, cfg.raster_blocks)
    # The layer word indexes the stacked weights an instruction reads; the final norm and the LM
    # head read unstacked ones ([H], [V/n, H]), so theirs is 0 like the prelude's.
    for arr in (template, prelude, final):
        arr[:, W_LAYER] = 0

    # replicate the layer template: layer l = template + l * incr (layer word, counter words) ------
    m = template.shape[0]
    N = len(prelude) + L * m + len(final)
    out = np.empty((N, INSTR_WORDS), np.int32) if _alloc is None else _alloc(N)
    out[:len(prelude)] = prelude
    tmpl32 = template.astype(np.int32)
    incr = np.zeros_like(tmpl32)
    incr[:, W_LAYER] = 1
    for wd in COUNTER_WORDS:
        incr[:, wd] = np.where(tmpl32[:, wd] != NO_COUNTER, CPL, 0)
    # an unsplit folded GEMM tile's epilogue wait is a counter word too (counter + 1; 0: none)
    epi = (np.isin(tmpl32[:, W_OPCODE], [int(o) for o in sk.ROW_SCALED])
           & (tmpl32[:, mc.A_EPI_WAIT] > 0))
    incr[epi, mc.A_EPI_WAIT] = CPL
    body = out[len(prelude):len(prelude) + L * m].reshape(L, m, INSTR_WORDS)
    step = np.zeros_like(tmpl32)
    for layer in range(L):
        np.add(tmpl32, step, out=body[layer])
        step += incr
    out[len(prelude) + L * m:] = final
    if fold_d:
        # layer 0's attention norms follow the prelude's EMBED tiles, which write HIDDEN whole:
        # nothing to fold (the EMBED tiles signal as many times as the split DOWN tiles would)
        first = body[0]
        attn_norm = (first[:, W_OPCODE] == Op.RMSNORM) & (first[:, rw.A_NORM_WEIGHT] == NormWeight.ATTN)
        first[attn_norm, rw.A_RED_NSPLIT] = 0
        first[attn_norm, rw.A_RED_STRIDE] = 0
    instrs = torch.from_numpy(out)

    # targets: the template's per-layer targets repeated, plus prelude and final -------------------
    n_final = 2 + (nb if fold_d else 0)     # LM_NORM, LM_HEAD done, and the folded DOWN's blocks
    NC = (L + 1) * CPL + n_final
    t_layer = counter_targets(tmpl32, 2 * CPL, n, rank)          # ids in blocks 0 (prev) and 1
    targets = np.zeros(NC, np.int32)
    targets[CPL:(L + 1) * CPL] = np.tile(t_layer[CPL:], L)
    assert not t_layer[:CPL].any(), "a layer's instructions signal only their own layer's counters"
    targets[:CPL] += counter_targets(prelude, CPL, n, rank)
    targets[(L + 1) * CPL:] += counter_targets(final, n_final, n, rank, base=(L + 1) * CPL)
    layout = {"cpl": CPL, "num_layers": L, "groups": groups_layout,
              "template": {"prelude": len(prelude), "per_layer": m, "final": len(final)},
              "splitk": {Op(op).name: (nb * ntiles[op], nsplit[op]) for op in ntiles}}
    return StepPlan(instrs, meta, torch.from_numpy(targets), rank, n, slice_w, layout, tl)


def counter_targets(words: np.ndarray, num_counters: int, n: int, rank: int,
                    base: int = 0) -> np.ndarray:
    """Final values of counters [base, base + num_counters) of `rank` when every rank runs a stream
    of this structure (the streams of all ranks have the same signals)."""
    sig = words[:, W_SIGNAL].astype(np.int64) - base
    scope = words[:, W_SIGNAL_SCOPE]
    cnt = words[:, W_SIGNAL_COUNT].astype(np.int64)
    has = words[:, W_SIGNAL] != NO_COUNTER
    local = has & (scope == SignalScope.LOCAL)
    peer = has & (scope == SignalScope.PEER) & (words[:, W_SIGNAL_RANK] == rank)
    every = has & (scope == SignalScope.ALL)
    t = np.zeros(num_counters, np.int64)
    for mask, mult in ((local, 1), (peer, n), (every, n)):
        if mask.any():
            t += mult * np.bincount(sig[mask], cnt[mask], minlength=num_counters).astype(np.int64)
    return t.astype(np.int32)


def parse_plan_overrides(text: str) -> dict:
    """FIELD=VALUE,... (the command lines' --plan) as PlanConfig keyword arguments: the integer
    fields other than split_k (each command line has its own flag for it), and policy (one of
    POLICIES); names checked and the result validated by PlanConfig itself; ValueError says what
    is wrong."""
    names = {f.name for f in fields(PlanConfig)} - {"split_k"}
    out = {}
    for part in filter(None, (t.strip() for t in text.split(","))):
        key, eq, val = part.partition("=")
        if not eq or key not in names:
            raise ValueError(f"{part!r} is not FIELD=VALUE with a PlanConfig field other than "
                             f"split_k ({', '.join(sorted(names))})")
        if key == "policy":
            out[key] = val          # PlanConfig says which names it takes
            continue
        try:
            out[key] = int(val)
        except ValueError:
            raise ValueError(f"{key}={val!r} is not an integer") from None
    PlanConfig(**out)           # its own validation, once, before any GPU work
    return out
