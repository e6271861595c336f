"""`--backend megakernel`: one rank's whole forward step in one persistent megakernel launch.

    backend = MegakernelStepBackend(weights, kernel)     # weights: mk.weights.RankWeights on CUDA
    logits = backend.forward(batch)                      # [num_seqs, vocab] float32

Per step: mk.plan plans the batch (every layer and the LM head), the step metadata is copied into
a fixed-capacity device buffer, and the megakernel variant of the step's M class (the GEMM tile
configs of mk.tiles for its token count) runs the stream; the logits are LOGITS[:num_seqs].

The backend owns every buffer of mk.plan.buffer_shapes, allocated once for the compiled maxima
(KernelConfig: max_batch_tokens, max_seqs, max_context, page_size, kv pages) and reused: the
activation arena [3, T, H] (HIDDEN, NORMED, SCRATCH), Q, ATTN_OUT, MLP_ACT, ATTN_PARTIAL /
ATTN_LSE (float32), LAST_NORMED, LOGITS (float32), the K/V cache as one [2, rows, hkv*D]
tensor (z = 0 K, z = 1 V: the layout both QKV_ROPE's append and the attention TMA read), and the
split-K workspace SPLITK (float32; only when PlanConfig.split_k != 1, as in this backend's
default auto split, DEFAULT_PLAN's split_k=0; as many rows as the plans' split factors need,
mk.plan.auto_splitk_rows; with split_k 1 the megakernel variant has no split-K code, unless
PlanConfig.norm_fold=2 needs the workspace for ROW_SCALE).

What it refuses, before anything runs (`unsupported_reasons`, CPU-importable checks):
    TP > 1 (needs mk.comm), weights not bfloat16 on a CUDA device, head_dim != 128, widths that are
    not multiples of 64 (K of a GEMM) or 8 (output columns), a page size that is not a power of two
    >= 8, a KV split that does not start on a 64-key block; per step: a batch over the compiled
    maximum tokens / sequences, a context past max_context or the KV pages (StepBatch.validate).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass

import torch

from mk.batch import StepBatch
from mk.config import KernelConfig, ModelConfig, ParallelConfig
from mk.instructions import _common as mc
from mk.instructions.base import Buf
from mk.plan import PlanConfig, Planner, buffer_shapes, to_device
from mk.tiles import NORM_MAX_HIDDEN
from mk.weights import RankWeights, fold_norms

GPU_HEAD_DIM = 128
K_ALIGN = 64            # GEMM K step (one 128-byte swizzle atom of bf16)
COL_ALIGN = 8           # 16-byte vectors of bf16
KEY_BLOCK = 64          # attention key block: a KV split must start on one
# The backend's PlanConfig when none is given (and launch/bench.py's, and the GPU check's, unless
# overridden). split_k 0: auto (the planner splits the GEMMs of small steps to fill the SMs;
# 15.3 vs 24.8 ms at decode B=1 on the 70B TP8 rank). norm_fold 4: the attention / MLP RMSNorm
# folded into the GEMM after it (the weights carry the norm weights, mk.weights.fold_norms), the
# rows' statistic from the tiles that wrote h (ROW_PART), so no norm is planned before an unsplit
# QKV / gate-up GEMM; at most 128 tokens the 70B rank's plans are the unfolded ones instruction
# for instruction (tests/test_megakernel_backend.py). norm_fold=2 (the default from session 41
# to 49: a row-scale norm before each folded GEMM) where the hidden size does not allow 4.
# H100, 70B TP8 rank decode (session 49, bench/results/nf4_summary_7e0568e_*): norm_fold 2 -> 4
# B=4096 -3.3% / -2.8%, B=1024 -0.8% / -1.0%, mixed -0.2% / -0.5% / -0.8%, B=256 +0.8% / +0.2%.
# `--plan norm_fold=2` (or 0: not folded) turns it back. attn_lpt 2: in a step with prompt
# chunks a layer's attention is queued the chunks first, in block order, then the decode units,
# longest first (attn_lpt 1, the default from session 56: the chunks longest first; H100,
# bench/results/attnlpt_*_s56*: the mixed step 46.275 / 46.460 -> 45.282 ms; 2 against 1,
# interleaved rep by rep on one kernel, session 61, bench/results/planpair_*_s61_h100*: the
# 4096-token prompt -0.8%, 256 + 2048 -1.1%, the 256 + 1024 mixed step +0.2% within its spread;
# its 1144-token check at kv_split 64 and racecheck clean in session 59, planab_l2cr_*);
# decode-only steps keep their plans; under another policy than op_major it is off unless given.
# attn_chunk_splits 1: a prompt segment split over KV (a context over kv_split) is cut into
# attn_chunk_rows chunks too (H100, session 58, bench/results/planab_*_s58_h100*: a
# 4096-token prompt alone 147.43 -> 142.19 ms, 256 decodes at ctx 1024 + a 2048-token prompt
# 93.51 -> 80.67 ms; its check of 1144 tokens at kv_split 64, 32 chunks with no key of their
# split, and racecheck clean); prompts within kv_split and decode steps plan as without it.
# attn_chunk_reduce 1: one ATTN_REDUCE per chunk of such a segment (H100, session 59,
# bench/results/planab_*_s59_h100*: the 4096-token prompt 141.87 -> 139.02 ms, 256 + 2048
# 80.90 -> 80.10, the 256 + 1024 mixed step 44.72 / 44.70: its plan is unchanged; the 1144-token
# check at kv_split 64 and racecheck clean).
DEFAULT_PLAN = dict(split_k=0, norm_fold=4, attn_lpt=2, attn_chunk_splits=1, attn_chunk_reduce=1)
# PlanConfig.norm_fold=4 on the GPU: the hidden size a multiple of this (mk.megakernel's
# _check_row_parts; gk.row_part_sumsq's chunks)
ROW_PART_HIDDEN_ALIGN = 4 * mc.ROW_PART_COLS
# the default's norm_fold where the model's hidden size does not allow DEFAULT_PLAN's
FALLBACK_NORM_FOLD = 2


def default_plan_config(model=None, **overrides) -> PlanConfig:
    """DEFAULT_PLAN with PlanConfig field overrides (theirs win). model: the ModelConfig the plan
    is for; when its hidden size does not allow norm_fold=4 and no norm_fold is given, the
    default falls back to FALLBACK_NORM_FOLD (an explicit norm_fold=4 is refused by
    check_supported instead)."""
    fields = {**DEFAULT_PLAN, **overrides}
    if ("norm_fold" not in overrides and fields["norm_fold"] == 4 and model is not None
            and model.hidden_size % ROW_PART_HIDDEN_ALIGN):
        fields["norm_fold"] = FALLBACK_NORM_FOLD
    if "attn_lpt" not in overrides and fields.get("policy", "op_major") != "op_major":
        fields["attn_lpt"] = 0          # an op_major order only (PlanConfig refuses it elsewhere)
    return PlanConfig(**fields)


def class_row_parts(plan_cfg: PlanConfig, model: ModelConfig, parallel, kernel: KernelConfig,
                    num_tokens: int) -> bool:
    """Whether the megakernel variant of num_tokens' M class compiles PlanConfig.norm_fold=4's
    ROW_PART code (mk.megakernel.GemmSlot.row_parts): only where a step of the class may use it
    (mk.plan.row_parts_planned; e.g. not where every O_PROJ / DOWN splits), so such classes keep
    the norm_fold=2 build (a plan that uses ROW_PART in a build without it is refused by the
    host check)."""
    from mk import tiles
    from mk.plan import row_parts_planned
    return row_parts_planned(plan_cfg, kernel, model, parallel,
                             tiles.class_fewest_tokens(num_tokens),
                             tiles.class_largest_tokens(num_tokens, kernel.max_batch_tokens))


def class_split_ops(plan_cfg: PlanConfig, num_tokens: int) -> frozenset | None:
    """The opcodes whose split-K tiles the megakernel variant of num_tokens' M class compiles
    in: those plan_cfg's plans may split in the class's smallest step (the others' split code,
    ~10% of the M1024 class's SASS, is left out; a plan that splits them is refused).
    MK_CLASS_SPLIT_OPS=0: None, every opcode's split code in every class (the build before
    session 43, for an A/B or a fallback until this one has its GPU checks)."""
    from mk import tiles
    if os.environ.get("MK_CLASS_SPLIT_OPS", "1") == "0":
        return None
    return plan_cfg.split_ops(tiles.class_fewest_tokens(num_tokens))


def class_bound(num_tokens: int) -> int:
    """The token bound of num_tokens' M class: the megakernel variant's gemm_m."""
    from mk import tiles
    return (tiles.M_CLASSES + (max(tiles.M_CLASSES[-1] + 1, num_tokens),))[
        tiles.m_class(num_tokens)]


def kernel_signature(plan_cfg: PlanConfig, model: ModelConfig, parallel, kernel: KernelConfig,
                     num_tokens: int) -> tuple:
    """What the backend's compiled variant of num_tokens' M class, its buffers and its folded
    weights take from a PlanConfig: plans of equal signatures run on one compiled kernel (the
    others differ in their instruction streams only)."""
    m = class_bound(num_tokens)
    return (plan_cfg.norm_fold, plan_cfg.l2_prefetch_mib > 0, class_split_ops(plan_cfg, m),
            class_row_parts(plan_cfg, model, parallel, kernel, m),
            buffer_shapes(model, parallel, kernel, plan_cfg))


class UnsupportedModelError(ValueError):
    """The model / parallel / kernel configuration is outside what the GPU bodies support."""


def unsupported_reasons(model: ModelConfig, parallel: ParallelConfig, kernel: KernelConfig,
                        plan_cfg: PlanConfig = PlanConfig(),
                        dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Why the megakernel cannot run this configuration (empty list: it can). CPU-only checks."""
    why = []
    if parallel.tp_size != 1:
        why.append(f"TP size {parallel.tp_size}: the megakernel runs TP 1 only until the "
                   "communication instructions (mk.comm) land; use --backend vm or reference")
    if dtype != torch.bfloat16:
        why.append(f"weights in {dtype}: the GPU bodies compute in bfloat16 (--dtype bfloat16)")
    if model.head_dim != GPU_HEAD_DIM:
        why.append(f"head_dim {model.head_dim}: QKV_ROPE and ATTENTION need head_dim "
                   f"{GPU_HEAD_DIM}")
    hq = parallel.heads_local(model)
    widths = {"hidden_size": model.hidden_size, "q heads x head_dim": hq * model.head_dim,
              "intermediate_size (per rank)": parallel.intermediate_local(model)}
    for name, w in widths.items():
        if w % K_ALIGN:
            why.append(f"{name} = {w} is not a multiple of {K_ALIGN} (the GEMM K step)")
    if parallel.vocab_local(model) % COL_ALIGN:
        why.append(f"vocab_size (per rank) {parallel.vocab_local(model)} is not a multiple of "
                   f"{COL_ALIGN}")
    if model.hidden_size > NORM_MAX_HIDDEN:
        why.append(f"hidden_size {model.hidden_size}: RMSNORM holds at most {NORM_MAX_HIDDEN} "
                   "columns per row")
    ps = kernel.page_size
    if ps < 8 or ps & (ps - 1):
        why.append(f"page_size {ps}: the attention TMA boxes need a power of two >= 8")
    if plan_cfg.kv_split % KEY_BLOCK:
        why.append(f"PlanConfig.kv_split {plan_cfg.kv_split} is not a multiple of {KEY_BLOCK}")
    if plan_cfg.kv_split_min % KEY_BLOCK:
        why.append(f"PlanConfig.kv_split_min {plan_cfg.kv_split_min} is not a multiple of "
                   f"{KEY_BLOCK} (the attention splits start on key blocks)")
    if plan_cfg.norm_fold == 4 and model.hidden_size % ROW_PART_HIDDEN_ALIGN:
        why.append(f"PlanConfig.norm_fold=4 with hidden_size {model.hidden_size}: the GEMM tiles "
                   f"scaled from ROW_PART read a quarter of a row's 64-column sums a lane in "
                   f"16-byte chunks, so the hidden size must be a multiple of "
                   f"{ROW_PART_HIDDEN_ALIGN} (norm_fold=2 runs any)")
    if plan_cfg.split_k != 1 and plan_cfg.splitk_align % K_ALIGN:
        why.append(f"PlanConfig.splitk_align {plan_cfg.splitk_align} is not a multiple of "
                   f"{K_ALIGN} (a split tile's K0 and K are TMA K coordinates)")
    return why


def check_supported(model, parallel, kernel, plan_cfg=PlanConfig(), dtype=torch.bfloat16) -> None:
    why = unsupported_reasons(model, parallel, kernel, plan_cfg, dtype)
    if why:
        raise UnsupportedModelError("megakernel backend cannot run this model: " + "; ".join(why))


def meta_capacity(kernel: KernelConfig) -> int:
    """Words of the largest step metadata buffer (mk.plan.build_meta's layout) the compiled
    maxima allow."""
    pages_per_seq = -(-kernel.max_context // kernel.page_size)
    return (mc.META_HEADER + 3 * kernel.max_batch_tokens
            + (mc.SEQ_WORDS + 1) * kernel.max_seqs + kernel.max_seqs * pages_per_seq)


class MegakernelStepBackend:
    """The engine backend: a model step per launch (see the module docstring)."""

    name = "megakernel"
    runs_ahead = True               # run_step(ahead=True, late=...): mk.engine queues steps

    def __init__(self, weights: RankWeights, kernel: KernelConfig, group=None,
                 plan_cfg: PlanConfig | None = None, timeout_s: float = 10.0,
                 journal: bool = False, verbose: bool = True, fold_in_place: bool = False):
        """plan_cfg: default_plan_config(model) when None. fold_in_place: under PlanConfig.norm_fold
        (the default's), fold the norm weights into the given weights themselves
        (mk.weights.fold_norms(inplace=True): no ~11 GB copy at the 70B TP8 rank; the caller's
        RankWeights is then marked folded) instead of into a copy; for a caller that owns them
        (Engine.from_pretrained's engines do: mk.engine owns_weights)."""
        from mk import megakernel as mkk
        mkk.require_gpu()
        model, parallel = weights.config, weights.parallel
        self.plan_cfg = plan_cfg or default_plan_config(model)
        check_supported(model, parallel, kernel, self.plan_cfg, weights.dtype)
        if not weights.qkv.is_cuda:
            raise UnsupportedModelError("megakernel backend: the weights must be on a CUDA device "
                                        f"(they are on {weights.qkv.device})")
        if self.plan_cfg.norm_fold:
            # the folded QKV / gate-up tiles run on h without a norm weight (PlanConfig.norm_fold)
            weights = fold_norms(weights, inplace=fold_in_place)
        self.weights, self.model, self.kernel = weights, model, kernel
        self.group = group
        self.timeout_s, self.journal, self.verbose = timeout_s, journal, verbose
        self.journal_capacity = 1 << 16     # journal rows (instructions past it are not recorded)
        self.device = dev = weights.qkv.device
        # MK_PLAN_FAST_PATH=0: every step planned in full (an A/B of the planner's fast path)
        self.planner = Planner(model, parallel, kernel, self.plan_cfg,
                               fast_path=os.environ.get("MK_PLAN_FAST_PATH", "1") != "0")
        shapes = buffer_shapes(model, parallel, kernel, self.plan_cfg)
        bf, f32 = torch.bfloat16, torch.float32
        T, H = shapes[Buf.HIDDEN]

        def buf(b, dtype=bf):
            return torch.zeros(shapes[b], dtype=dtype, device=dev)

        self.arena = torch.zeros(3, T, H, dtype=bf, device=dev)   # HIDDEN, NORMED, SCRATCH
        self.q, self.attn_out, self.mlp_act = buf(Buf.Q), buf(Buf.ATTN_OUT), buf(Buf.MLP_ACT)
        self.attn_partial, self.attn_lse = buf(Buf.ATTN_PARTIAL, f32), buf(Buf.ATTN_LSE, f32)
        self.last_normed, self.logits = buf(Buf.LAST_NORMED), buf(Buf.LOGITS, f32)
        kv_rows, kv_w = shapes[Buf.K_CACHE]
        self.kv = torch.zeros(2, kv_rows, kv_w, dtype=bf, device=dev)
        # split-K partials (rows 0 when the plans never split: no workspace, no split-K variant)
        self.splitk = buf(Buf.SPLITK, f32) if shapes[Buf.SPLITK][0] > 0 else None
        self.meta = torch.zeros(meta_capacity(kernel), dtype=torch.int32, device=dev)
        from mk.reference import rope_inv_freq
        self.inv_freq = rope_inv_freq(model.head_dim, model.rope).float().to(dev)
        self.normw = mkk.norm_table(weights).to(dev)
        self._kernels: dict = {}        # M class -> mk.megakernel.Megakernel (one variant each)
        # the last checked and uploaded stream: (megakernel, plan serial) and its handle; a
        # planner fast-path plan of that serial only rewrites attention words on the device
        self._held, self._handle = (None, 0), None
        self.stream_uploads = 0         # full uploads (the rest were rewrites; for benchmarks)
        self.steps = 0
        self.last_launch_s = None
        self.last_prepare_s = None      # the last step's host share: plan, check, uploads
        # launches of run_step not yet finish()ed, oldest first: (Megakernel, LaunchRecord)
        self._in_flight: deque = deque()

    # -- buffers ---------------------------------------------------------------------------------
    def kv_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V as [L, num_pages, page_size, kv_heads, D] views (mk.vm.VM.kv_cache's shape)."""
        shape = (self.model.num_layers, self.kernel.kv_pages, self.kernel.page_size, -1,
                 self.model.head_dim)
        return self.kv[0].view(shape), self.kv[1].view(shape)

    def row_part(self) -> torch.Tensor | None:
        """ROW_PART [T, 2 * H / 64] float32 (PlanConfig.norm_fold=4; mk.instructions.base.
        Buf.ROW_PART) as a view of its rows of the SPLITK allocation (mk.plan.splitk_shape),
        else None."""
        if self.plan_cfg.norm_fold != 4 or self.splitk is None:
            return None
        T, H = self.arena.shape[1], self.arena.shape[2]
        ld = mc.row_part_ld(H)
        first = mc.row_part_offset(self.splitk.numel(), T, ld)
        return self.splitk.view(-1)[first:first + T * ld].view(T, ld)

    def _operands(self):
        from mk import megakernel as mkk
        from mk.ir import Op
        w = self.weights
        G = mkk.GemmOperands
        return {
            Op.QKV_ROPE: G(self.arena, w.qkv, self.q, int(Buf.HIDDEN), int(Buf.Q)),
            Op.O_PROJ: G(self.attn_out, w.o, self.arena, int(Buf.ATTN_OUT), int(Buf.HIDDEN)),
            Op.GATE_UP: G(self.arena, w.gate_up, self.mlp_act, int(Buf.HIDDEN), int(Buf.MLP_ACT)),
            Op.DOWN: G(self.mlp_act, w.down, self.arena, int(Buf.MLP_ACT), int(Buf.HIDDEN)),
            Op.LM_HEAD: G(self.last_normed, w.lm_head, self.logits, int(Buf.LAST_NORMED),
                          int(Buf.LOGITS)),
        }

    def megakernel_for(self, num_tokens: int):
        """The Megakernel of num_tokens' M class (built, and compiled at first launch, once)."""
        from mk import megakernel as mkk
        from mk import tiles
        c = tiles.m_class(num_tokens)
        if c not in self._kernels:
            m = class_bound(num_tokens)
            self._kernels[c] = mkk.Megakernel(
                self.arena, self.normw, self.model.num_layers, self.model.rms_norm_eps,
                journal=self.journal, journal_capacity=self.journal_capacity,
                timeout_s=self.timeout_s, verbose=self.verbose,
                gemm=self._operands(), gemm_m=m, meta=self.meta, inv_freq=self.inv_freq,
                kv=self.kv,
                attn=mkk.AttnOperands(self.q, self.attn_out, self.attn_partial, self.attn_lse,
                                      self.kernel.page_size),
                embed=self.weights.embed, last_normed=self.last_normed, splitk=self.splitk,
                l2_prefetch=self.plan_cfg.l2_prefetch_mib > 0,
                split_ops=class_split_ops(self.plan_cfg, m),
                self_scale=self.plan_cfg.norm_fold == 3,
                row_parts=class_row_parts(self.plan_cfg, self.model, self.planner.parallel,
                                          self.kernel, m))
        return self._kernels[c]

    # -- a step ----------------------------------------------------------------------------------
    # A step is two halves: plan_step (host only: plan, check) and run_step (uploads, the
    # metadata, the launch, not waited for; after the previous launch is waited for and checked,
    # or with ahead=True queued behind it). The engine plans step n + 1 while step n runs and
    # queues it behind step n (mk.engine: Engine.generate), so the planner's, the check's and
    # the launch's milliseconds are off the GPU's critical path; forward() is both halves and
    # finish() back to back.
    def plan_step(self, batch: StepBatch) -> "PreparedStep":
        """Plan the batch and check its stream against the kernel, on the host only (no device
        work: a launch may be in flight). A plan the planner's fast path made from the stream
        held on the device (a decode step of the same structure) is not checked: run_step
        rewrites its attention position words in the device copy (mk.plan.StreamAdvance; the
        words the check reads of them, and their bounds, are the held plan's or the batch's,
        validated here)."""
        t0 = time.perf_counter()
        k = self.kernel
        batch.validate(k.page_size, k.kv_pages, max_tokens=k.max_batch_tokens,
                       max_context=k.max_context)
        if len(batch.seqs) > k.max_seqs:
            raise ValueError(f"batch has {len(batch.seqs)} sequences, over the compiled maximum "
                             f"{k.max_seqs}")
        plan = self.planner.plan(batch)
        if plan.meta.tensor.numel() > self.meta.numel():
            raise ValueError(f"step metadata of {plan.meta.tensor.numel()} words exceeds the "
                             f"buffer's {self.meta.numel()}")
        # a class's first step builds its Megakernel in run_step, after the launch in flight
        # (its device allocations might otherwise wait for that launch, hang guard or not)
        mk = self._built_megakernel(plan.meta.num_tokens)
        n_ctr = None
        if mk is not None and not self._advances_held(mk, plan):
            # the planner's stream is a layer template repeated: checking the prelude, the first
            # and last layers and the final rows is checking it all (a 40th of the rows: ~1 ms)
            n_ctr = mk.check_stream(plan.representative_stream(), meta_page_size=k.page_size)
        return PreparedStep(mk, plan, n_ctr, time.perf_counter() - t0)

    def _built_megakernel(self, num_tokens: int):
        from mk import tiles
        return self._kernels.get(tiles.m_class(num_tokens))

    def _advances_held(self, mk, plan) -> bool:
        return plan.advance is not None and self._held[0] is mk and self._held[1] == plan.serial

    def run_step(self, prep: "PreparedStep", tokens: dict[int, int] | None = None,
                 late: "LateTokens | None" = None, ahead: bool = False) -> torch.Tensor:
        """Launch a planned step; returns its logits [num_seqs, vocab] float32 on the device, in
        flight until finish(). tokens: {sequence index in the batch: token id} for sequences
        whose (one-token) chunk was planned before its token was known (the engine's decodes
        after a step still in flight); each goes into the metadata's token row of that
        sequence's first new token. late: such tokens still on the device (a step in flight
        samples them), gathered there behind it.

        ahead=False finishes the launches in flight first. ahead=True queues this step behind
        the one in flight (at most one: an older one is finished first), so that the device
        goes from one step to the next without the host in between: its uploads are page-locked
        copies in the stream's order (the running step reads the stream and metadata they
        overwrite), and its late tokens must come as `late`. A class's first step still
        finishes the launches in flight first (building its Megakernel allocates on the
        device)."""
        self.finish(keep=1 if ahead and prep.megakernel is not None else 0)
        t0 = time.perf_counter()
        if tokens:
            meta = prep.plan.meta
            rows = torch.as_tensor([int(meta.seq_row0[i]) for i in tokens], dtype=torch.long)
            meta.tokens[rows] = torch.as_tensor(list(tokens.values()), dtype=meta.tensor.dtype)
        self._upload(prep, late)
        self.last_prepare_s = prep.host_s + time.perf_counter() - t0
        t1 = time.perf_counter()
        rec = prep.megakernel.launch(self._handle, check=False, record=True)
        self._in_flight.append((prep.megakernel, rec))
        self.last_launch_s = time.perf_counter() - t1
        self.steps += 1
        return self.logits[:prep.plan.meta.num_seqs].clone()

    def finish(self, keep: int = 0) -> None:
        """Wait for the run_step launches in flight, oldest first, until `keep` are left, and
        check each (raises MegakernelError / MegakernelHang as forward() would); a no-op when
        none is in flight. A launch that fails drops the ones queued behind it (not waited for:
        after a hang they never end, a hang_s each)."""
        while len(self._in_flight) > keep:
            mk, rec = self._in_flight.popleft()
            try:
                mk.finish_launch(rec, mk.hang_s)
            except BaseException:
                while self._in_flight:
                    behind, rec = self._in_flight.popleft()
                    behind.drop_launch(rec)
                raise

    def _upload(self, prep: "PreparedStep", late: "LateTokens | None" = None) -> None:
        """run_step's device half before the launch: the stream (rewritten in place when the fast
        path advanced the held one) and the metadata, with the late tokens gathered into it. In
        the stream's order, so behind a launch in flight that reads them. Builds the step's
        Megakernel where plan_step left it unbuilt."""
        if prep.megakernel is None:
            prep.megakernel = self.megakernel_for(prep.plan.meta.num_tokens)
        mk, plan = prep.megakernel, prep.plan
        if prep.n_ctr is None and self._advances_held(mk, plan):
            plan.advance.apply(self._handle[0])
        else:
            n_ctr = prep.n_ctr
            if n_ctr is None:       # the held stream changed since plan_step: check it now
                n_ctr = mk.check_stream(plan.representative_stream(),
                                        meta_page_size=self.kernel.page_size)
            self._handle = mk.upload(plan.device_stream(self.device), n_ctr)
            self._held = (mk, plan.serial)
            self.stream_uploads += 1
        meta = plan.meta.tensor
        to_device(meta, out=self.meta[:meta.numel()])
        if late is not None and late.rows:
            dest = plan.meta.word(mc.M_OFF_TOKENS) + torch.as_tensor(
                [int(plan.meta.seq_row0[j]) for j in late.rows], dtype=torch.long)
            src = torch.as_tensor(list(late.rows.values()), dtype=torch.long)
            self.meta[to_device(dest, self.device)] = \
                late.tokens[to_device(src, self.device)].to(self.meta.dtype)

    def prepare(self, batch: StepBatch):
        """Plan, check and upload the batch without launching it (benchmarks time the launch
        alone): (megakernel, handle, plan), the metadata copied into the device buffer."""
        self.finish()
        prep = self.plan_step(batch)
        self._upload(prep)
        return prep.megakernel, self._handle, prep.plan

    def prepare_variant(self, batch: StepBatch, plan_cfg: PlanConfig):
        """The batch planned under another PlanConfig for this backend's compiled kernel and
        buffers (an A/B of plans in one process: launch/bench.py --plan-ab): (megakernel,
        handle, plan, its metadata on the device). The held stream and self.meta are left as
        they are: the caller copies the metadata into self.meta before launching the handle.
        Raises ValueError when plan_cfg needs another kernel, other buffers or other folded
        weights (time it as its own --plan run)."""
        sig = [kernel_signature(c, self.model, self.planner.parallel, self.kernel,
                                batch.num_tokens) for c in (plan_cfg, self.plan_cfg)]
        if sig[0] != sig[1]:
            raise ValueError(f"plan {plan_cfg} needs another compiled kernel, other buffers or "
                             f"other folded weights than the backend's ({self.plan_cfg}): "
                             "time it as its own run")
        plan = Planner(self.model, self.planner.parallel, self.kernel, plan_cfg,
                       fast_path=False).plan(batch)
        mk = self.megakernel_for(plan.meta.num_tokens)
        handle = mk.prepare(plan.device_stream(self.device), meta_page_size=self.kernel.page_size,
                            check_stream=plan.representative_stream())
        meta = plan.meta.tensor
        if meta.numel() > self.meta.numel():
            raise ValueError(f"step metadata of {meta.numel()} words exceeds the buffer's "
                             f"{self.meta.numel()}")
        return mk, handle, plan, meta.to(self.device)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        logits = self.run_step(self.plan_step(batch))
        self.finish()
        return logits


@dataclass
class LateTokens:
    """Decode tokens a step in flight samples, for the step queued behind it (run_step(late=)):
    batch sequence j's token is tokens[rows[j]]."""
    tokens: torch.Tensor            # [S] int64, on the device
    rows: dict[int, int]            # sequence index in the batch -> row of `tokens`


@dataclass
class PreparedStep:
    """A step planned and checked on the host, not yet on the device (MegakernelStepBackend.
    plan_step -> run_step)."""
    megakernel: object              # mk.megakernel.Megakernel of the step's M class (None:
    #                                 not built yet; run_step builds it and checks the stream)
    plan: object                    # mk.plan.StepPlan
    n_ctr: int | None               # the check's counter count; None: a fast-path plan
    host_s: float                   # plan_step's seconds


def _register() -> None:
    from mk.engine import register_backend
    register_backend("megakernel")(
        lambda weights, kernel, group=None, *, owns_weights=False: MegakernelStepBackend(
            weights, kernel, group, fold_in_place=owns_weights))


_register()


# ==================================================================================== host check
def meta_operands(model: ModelConfig, kernel: KernelConfig, plan_cfg: PlanConfig,
                  num_tokens: int) -> tuple[int, int, int, dict]:
    """(nbuf, T, H, keyword arguments of mk.megakernel.check_plan) for the operands this backend
    allocates, as meta tensors (shapes only, no memory, no GPU): the host check of a step of
    num_tokens tokens on any machine (tests, bench/host_step.py). TP 1 (or one rank's shard seen
    as TP 1, mk.peers.shard_as_tp1)."""
    from mk import megakernel as mkk
    from mk.config import ParallelConfig as PC
    from mk.ir import Op
    sh = buffer_shapes(model, PC(), kernel, plan_cfg)
    T, H = sh[Buf.HIDDEN]
    L, D = model.num_layers, model.head_dim
    hq, hkv, I, V = model.num_heads, model.num_kv_heads, model.intermediate_size, model.vocab_size

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")
    arena = meta(3, T, H)
    G = mkk.GemmOperands
    gemm = {Op.QKV_ROPE: G(arena, meta(L, (hq + 2 * hkv) * D, H), meta(*sh[Buf.Q]), 0, int(Buf.Q)),
            Op.O_PROJ: G(meta(*sh[Buf.ATTN_OUT]), meta(L, H, hq * D), arena, int(Buf.ATTN_OUT), 0),
            Op.GATE_UP: G(arena, meta(L, 2 * I, H), meta(*sh[Buf.MLP_ACT]), 0, int(Buf.MLP_ACT)),
            Op.DOWN: G(meta(*sh[Buf.MLP_ACT]), meta(L, H, I), arena, int(Buf.MLP_ACT), 0),
            Op.LM_HEAD: G(meta(*sh[Buf.LAST_NORMED]), meta(V, H),
                          meta(*sh[Buf.LOGITS], dtype=torch.float32), int(Buf.LAST_NORMED),
                          int(Buf.LOGITS))}
    f32 = torch.float32
    kw = dict(gemm=gemm, slots=mkk.gemm_slots(gemm, num_tokens,
                                             split_ops=class_split_ops(plan_cfg, num_tokens),
                                             self_scale=plan_cfg.norm_fold == 3,
                                             row_parts=class_row_parts(plan_cfg, model, PC(),
                                                                       kernel, num_tokens)),
              kv_shape=(2,) + tuple(sh[Buf.K_CACHE]),
              attn=mkk.AttnOperands(meta(*sh[Buf.Q]), meta(*sh[Buf.ATTN_OUT]),
                                    meta(*sh[Buf.ATTN_PARTIAL], dtype=f32),
                                    meta(*sh[Buf.ATTN_LSE], dtype=f32), kernel.page_size),
              embed_shape=(V, H), last_normed_shape=tuple(sh[Buf.LAST_NORMED]),
              meta_page_size=kernel.page_size,
              splitk_shape=tuple(sh[Buf.SPLITK]) if sh[Buf.SPLITK][0] > 0 else None,
              l2_prefetch=plan_cfg.l2_prefetch_mib > 0)
    return 3, T, H, kw


# ==================================================================================== self-check
# the check's kernel: sequences (the prompts and one late prefill chunk), context, step tokens;
# more than CHECK_SEQS - 1 prompts (up to MAX_CHECK_SEQS - 1) size the kernel's sequences to
# them: 64 one-token prompts make a step whose LM_HEAD runs one full 64-row tile; prompts of
# more than CHECK_TOKENS tokens together (up to MAX_CHECK_TOKENS) size its step tokens to them:
# a first step of more than 1024 tokens runs the variant of the M > 1024 class (B=4096's and
# the mixed step's), e.g. --prompt-lens 500,500,130,13,1 (1144 tokens)
CHECK_SEQS, CHECK_CONTEXT, CHECK_TOKENS, MAX_CHECK_TOKENS = 8, 512, 512, 2048
MAX_CHECK_SEQS = 128


def check_seqs(prompt_lens: tuple[int, ...]) -> int:
    """The check kernel's max_seqs for these prompts (and the late prefill chunk)."""
    return max(CHECK_SEQS, len(prompt_lens) + 1)


def check_tokens(prompt_lens: tuple[int, ...]) -> int:
    """The check kernel's max_batch_tokens for these prompts (the first step holds them all;
    the later steps are their decode tokens and a 40-token chunk)."""
    return max(CHECK_TOKENS, sum(prompt_lens))


def check_prompt_lens(prompt_lens: tuple[int, ...], decode_steps: int) -> None:
    """ValueError unless check_against_vm's kernel holds these prompts and decode steps."""
    if not 1 <= len(prompt_lens) <= MAX_CHECK_SEQS - 1 or min(prompt_lens) < 1 \
            or sum(prompt_lens) > MAX_CHECK_TOKENS \
            or max(prompt_lens) + decode_steps + 1 > CHECK_CONTEXT:
        raise ValueError(f"prompt lengths {list(prompt_lens)}: 1 to {MAX_CHECK_SEQS - 1} prompts "
                         f"of at least 1 token, at most {MAX_CHECK_TOKENS} together, each at most "
                         f"{CHECK_CONTEXT - decode_steps - 1} (the check's kernel: "
                         f"max_context {CHECK_CONTEXT} with {decode_steps} decode steps)")


def check_against_vm(layers: int | None = None, kv_split: int = 64, seed: int = 0,
                     decode_steps: int = 3, verbose: bool = True, split_k: int = 1,
                     kv_split_min: int = 0, num_sms: int = 132, l2_prefetch_mib: int = 0,
                     plan: dict | None = None,
                     prompt_lens: tuple[int, ...] = (1, 13, 64, 130)) -> dict:
    """One mixed run of the tiny head_dim-128 model on the GPU: a prefill step of prompts of
    several lengths (some split over KV blocks of kv_split keys), then decode steps that mix in a
    second prefill chunk; every step's logits vs mk.vm on the same weights (bf16 tolerance) and the
    greedy tokens equal. The small run compute-sanitizer checks
    (`python -m mk.megakernel_step check --layers 2`). split_k: PlanConfig.split_k of both sides
    (1 never; n >= 2 forces n-way split-K tiles + SPLITK_REDUCE in every step within an op's
    split cap: QKV_ROPE 1024 tokens, GATE_UP 256, O_PROJ / DOWN 128; 0 auto), so the megakernel
    runs the split plan the interpreter runs. kv_split_min /
    num_sms: PlanConfig's (decode splits spread over the SMs), on both sides too; l2_prefetch_mib:
    PlanConfig's (L2_PREFETCH instructions in the steps whose attention leaves SMs idle); plan:
    further PlanConfig fields (e.g. splitk_qkv_max_tokens; they win over the arguments above),
    on both sides; the rest are default_plan_config's (norm_fold=4: the interpreter runs a folded
    copy of the weights, as the backend does). prompt_lens: the
    first step's prompts (at most MAX_CHECK_SEQS - 1, at most MAX_CHECK_TOKENS tokens together;
    208 by default, a step of the M <= 256 tile class; 257 to 1024 run the M <= 1024 class's
    variant, more the M > 1024 class's)."""
    check_prompt_lens(prompt_lens, decode_steps)
    from dataclasses import replace as dc_replace

    from mk.batch import SeqChunk
    from mk.config import ParallelConfig as PC
    from mk.engine import PageManager, default_kernel_config
    from mk.tiny import TINY_HD128_CONFIG, tiny_checkpoint
    from mk.vm import VM
    from mk.weights import fold_norms, load_rank_weights

    cfg = TINY_HD128_CONFIG if layers is None else dc_replace(TINY_HD128_CONFIG, num_layers=layers)
    ckpt = tiny_checkpoint(seed=seed, config=cfg)
    w = load_rank_weights(ckpt, PC(), dtype=torch.bfloat16, device=torch.device("cuda"),
                          progress=False)
    kernel = default_kernel_config(cfg, max_seqs=check_seqs(prompt_lens),
                                   max_context=CHECK_CONTEXT,
                                   max_batch_tokens=check_tokens(prompt_lens))
    pcfg = default_plan_config(cfg, **{**dict(kv_split=kv_split, split_k=split_k,
                                              kv_split_min=kv_split_min, num_sms=num_sms,
                                              l2_prefetch_mib=l2_prefetch_mib),
                                            **(plan or {})})
    mk = MegakernelStepBackend(w, kernel, plan_cfg=pcfg, verbose=verbose)
    # the interpreter runs its torch faces on the CPU, on a copy of the same weights
    w_cpu = load_rank_weights(ckpt, PC(), dtype=torch.bfloat16, device=torch.device("cpu"),
                              progress=False)
    vm = VM([fold_norms(w_cpu) if pcfg.norm_fold else w_cpu], kernel, pcfg, device="cpu")
    pages = PageManager(kernel.kv_pages, kernel.page_size)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in prompt_lens]
    late = torch.randint(0, cfg.vocab_size, (40,), generator=g).tolist()
    for i, p in enumerate(prompts + [late]):
        pages.allocate(i, len(p) + decode_steps + 1)
    ctx = [0] * (len(prompts) + 1)
    steps, worst, ok = [], 0.0, True
    batch = StepBatch([SeqChunk(p, 0, pages.pages(i)) for i, p in enumerate(prompts)])
    plan_ops = None
    for step in range(decode_steps + 1):
        if step == 0:       # the first step's opcodes (SPLITK_REDUCE count: the split is on)
            plan_ops = mk.planner.plan(batch).instrs[:, 0]
        got = mk.forward(batch).cpu()
        want = vm.step(batch)
        tol = 0.02 * float(want.abs().max())
        err = float((got - want).abs().max())
        # a different argmax is accepted only at a near-tie of the interpreter's own logits (its
        # value of the megakernel's token within tol of its best): random tiny weights make such
        # ties common, and bf16 summation order can break them either way
        picked = want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
        gap = want.max(-1).values - picked
        same = bool(torch.equal(got.argmax(-1), want.argmax(-1)))
        ties = int((gap > 0).sum())
        ok &= err <= tol and bool((gap <= tol).all())
        worst = max(worst, err / max(tol, 1e-30))
        steps.append(dict(tokens=batch.num_tokens, seqs=len(batch.seqs), max_abs_err=err,
                          tol=tol, argmax_equal=same, near_ties=ties,
                          worst_tie_gap=float(gap.max())))
        batch_tokens_last = batch.num_tokens
        for j, c in enumerate(batch.seqs):
            ctx[j] = c.end_pos
        nxt = want.argmax(-1).tolist()
        chunks = [SeqChunk([nxt[j]], ctx[j], pages.pages(j)) for j in range(len(prompts))]
        if step == 0:       # a prefill chunk joins the decode batch
            chunks.append(SeqChunk(late[:24], 0, pages.pages(len(prompts))))
        elif step == 1:
            chunks.append(SeqChunk(late[24:], 24, pages.pages(len(prompts))))
        batch = StepBatch(chunks)
    # only the slots the steps wrote: the rest of the megakernel's cache is never initialised
    ps = kernel.page_size
    slots = torch.tensor([pages.pages(j)[t // ps] * ps + t % ps
                          for j in range(len(ctx)) for t in range(ctx[j])])
    kv_err = 0.0
    for a, b in zip(mk.kv_cache(), vm.kv_cache(0)):
        a = a.flatten(1, 2)[:, slots.to(a.device)].float().cpu()
        b = b.flatten(1, 2)[:, slots].float()
        kv_err = max(kv_err, float((a - b).abs().max()))
    extra = {}
    if mk.row_part() is not None:
        # norm_fold=4: the last step's ROW_PART sums (its last layer's writers) on both sides,
        # relative to the largest; which of the writers or the readers a failed check points at
        # (the interpreter's never-written sums are its NaN poison: a set whose GEMM split)
        T = batch_tokens_last
        b = vm.world[0].buf(Buf.ROW_PART)[:T].float()
        seen = torch.isfinite(b)
        a = mk.row_part()[:T].float().cpu()[seen]
        b = b[seen]
        extra["row_part_values"] = int(seen.sum())
        extra["row_part_max_rel_diff"] = (float((a - b).abs().max() / b.abs().max())
                                          if len(b) else 0.0)
    return dict(passed=ok, layers=cfg.num_layers, kv_split=kv_split, split_k=split_k,
                kv_split_min=kv_split_min, **extra,
                split_instrs=int((plan_ops == _split_op()).sum()) if plan_ops is not None else 0,
                steps=steps,
                worst_err_over_tol=worst, kv_cache_max_abs_diff=kv_err,
                device=torch.cuda.get_device_name())


def _split_op() -> int:
    from mk.ir import Op
    return int(Op.SPLITK_REDUCE)


def _main(argv=None) -> int:
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m mk.megakernel_step",
                                 description="check: the tiny head_dim-128 model's steps through "
                                 "the megakernel vs the interpreter (mk.vm) on the GPU")
    ap.add_argument("cmd", choices=["check"])
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the tiny model's 4)")
    ap.add_argument("--kv-split", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decode-steps", type=int, default=3)
    ap.add_argument("--split-k", type=int, default=1, help="PlanConfig.split_k: 1 never (default), "
                    "n >= 2 force n, 0 auto")
    ap.add_argument("--kv-split-min", type=int, default=0,
                    help="PlanConfig.kv_split_min (0: never spread decode splits; the tiny model's "
                    "steps then spread over --num-sms)")
    ap.add_argument("--num-sms", type=int, default=132, help="PlanConfig.num_sms")
    ap.add_argument("--l2-prefetch-mib", type=int, default=0,
                    help="PlanConfig.l2_prefetch_mib (0: no L2_PREFETCH instructions)")
    ap.add_argument("--plan", default="", metavar="FIELD=VALUE,...",
                    help="further PlanConfig fields, e.g. splitk_qkv_max_tokens=256")
    ap.add_argument("--prompt-lens", default="1,13,64,130", metavar="N,N,...",
                    help="the first step's prompt lengths (default 208 tokens; over 256 tokens "
                    "the step runs the M <= 512 tile class)")
    a = ap.parse_args(argv)
    try:
        from mk.plan import parse_plan_overrides
        plan = parse_plan_overrides(a.plan)
        try:
            lens = tuple(int(t) for t in a.prompt_lens.split(",") if t.strip())
        except ValueError:
            raise ValueError(f"--prompt-lens {a.prompt_lens!r} is not N,N,... (integers)") from None
        check_prompt_lens(lens, a.decode_steps)
        from mk import megakernel as mkk
        mkk.require_gpu("the megakernel check", hint="")
        r = check_against_vm(a.layers, a.kv_split, a.seed, a.decode_steps, split_k=a.split_k,
                             kv_split_min=a.kv_split_min, num_sms=a.num_sms,
                             l2_prefetch_mib=a.l2_prefetch_mib, plan=plan, prompt_lens=lens)
    except (RuntimeError, ValueError) as e:
        print(f"error: {type(e).__name__}: {e}", file=__import__("sys").stderr)
        return 1
    print(json.dumps(r), flush=True)
    return 0 if r["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(_main())
