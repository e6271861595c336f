"""The CPU interpreter of the instruction stream: exact, slow, the oracle the megakernel must match.

    vm = VM([weights_rank0, weights_rank1, ...], kernel, PlanConfig())   # n simulated TP ranks
    logits = vm.step(batch)                           # [num_seqs, V] float32, like the reference
    logits = vm.step(batch, mode="random", sms=4, seed=1)

It plans the step (mk.plan), then executes the serialized int32 stream, opcode by opcode, with the
torch semantics kept beside each opcode in mk/instructions/, over the named buffers the megakernel
uses (mk.plan.buffer_shapes: activations, RECV, split-KV partials, the KV cache as K_CACHE/V_CACHE,
one int32 counter array per rank). Buffers start as NaN, so a read of something never written shows.

Modes:
    queue   every rank runs its queue in order; the ranks are interleaved deterministically (run the
            lowest rank's next instruction whose waits hold, until none can run).
    random  each rank has `sms` virtual SMs; a free SM takes the next instruction of its rank's
            queue (the megakernel's atomic ticket); at every step one SM whose instruction's waits
            hold is picked at random and runs it. A missing dependency then shows up as a wrong
            result, and a wait that can never be met raises VMStall naming the stuck instructions,
            their counters, values and targets.
After the step every counter must equal its planned target (VMError otherwise).

Distributed (torchrun, one rank per process, `group`): each process runs its own rank's queue;
stores and signals aimed at other ranks are staged and exchanged with all_gather_object whenever
every process is blocked, until every queue is done.

The vm backend of mk.engine is registered here ("vm"); options from the environment:
MK_VM_MODE (queue|random), MK_VM_SMS, MK_VM_SEED, MK_VM_POLICY, MK_VM_KV_SPLIT, MK_VM_SPLIT_K
(PlanConfig.split_k: 0 auto, n force).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch

from mk.batch import StepBatch
from mk.config import KernelConfig
from mk.instructions._common import all_waits
from mk.instructions.base import Buf, family_of
from mk.ir import Instruction, SignalScope, op_name
from mk.plan import PlanConfig, StepPlan, buffer_dtype, buffer_shapes, instruction_accesses, plan_step
from mk.weights import RankWeights, fold_norms


class VMError(RuntimeError):
    pass


class VMStall(VMError):
    pass


class RankState:
    """One rank's buffers, counters and weights: the ExecState of mk.instructions."""

    def __init__(self, rank: int, tp: int, weights: RankWeights | None, shapes, dtype, device, world):
        self.rank = rank
        self.tp = tp
        self.weights = weights
        self.world = world          # rank -> RankState (or a remote shadow)
        self.meta = None
        self.bufs = {b: torch.full(s, float("nan"), dtype=buffer_dtype(b, dtype), device=device)
                     for b, s in shapes.items()}
        self.counters: list[int] = []

    def buf(self, buf_id: int, rank: int | None = None) -> torch.Tensor:
        if rank is None or rank == self.rank:
            return self.bufs[buf_id]
        return self.world[rank].bufs[buf_id]

    def reset_activations(self) -> None:
        for b, t in self.bufs.items():
            if b not in (Buf.K_CACHE, Buf.V_CACHE):
                t.fill_(float("nan"))


class _Shadow:
    """A remote rank's buffers as seen from this process (distributed mode): stores land here and
    are shipped to their owner at the next exchange."""

    def __init__(self, shapes, dtype, device):
        self._shapes, self._dtype, self._device = shapes, dtype, device
        self._bufs: dict = {}

    @property
    def bufs(self):
        return self

    def __getitem__(self, b):
        if b not in self._bufs:
            self._bufs[b] = torch.zeros(self._shapes[b], dtype=buffer_dtype(b, self._dtype),
                                        device=self._device)
        return self._bufs[b]


@dataclass
class _Queue:
    instrs: list[Instruction]
    head: int = 0


def check_norms_folded(weights: RankWeights, plan_cfg: PlanConfig) -> None:
    """PlanConfig.norm_fold runs the split QKV / gate-up GEMMs on h without a norm weight: the
    weights must carry it (mk.weights.fold_norms), or the step would be silently wrong."""
    if plan_cfg.norm_fold and not weights.norms_folded:
        raise ValueError("PlanConfig.norm_fold needs weights with the attention / MLP norm "
                         "weights folded into qkv / gate_up: pass mk.weights.fold_norms(weights)")


class VM:
    def __init__(self, weights: list[RankWeights] | RankWeights, kernel: KernelConfig,
                 plan_cfg: PlanConfig = PlanConfig(), group=None, device="cpu"):
        if isinstance(weights, RankWeights):
            weights = [weights]
        self.kernel = kernel
        self.plan_cfg = plan_cfg
        self.group = group
        first = weights[0]
        self.config = first.config
        self.tp = first.parallel.tp_size
        self.dtype = first.dtype
        self.distributed = len(weights) == 1 and self.tp > 1
        if not self.distributed and len(weights) != self.tp:
            raise ValueError(f"weights are sharded for TP {self.tp}: give all {self.tp} ranks "
                             f"(got {len(weights)}), or one rank under torch.distributed")
        for r, w in enumerate(weights):
            if not self.distributed and w.parallel.rank != r:
                raise ValueError(f"weights[{r}] are rank {w.parallel.rank}'s")
            check_norms_folded(w, plan_cfg)
        self.local_ranks = [w.parallel.rank for w in weights]
        self.shapes = buffer_shapes(self.config, first.parallel, kernel, plan_cfg)
        self.world: dict = {}
        for w in weights:
            self.world[w.parallel.rank] = RankState(w.parallel.rank, self.tp, w, self.shapes,
                                                    self.dtype, device, self.world)
        if self.distributed:
            for r in range(self.tp):
                if r not in self.world:
                    self.world[r] = _Shadow(self.shapes, self.dtype, device)
        self.last_plan: StepPlan | None = None
        self.executed = 0
        self._families: dict = {}

    # ---------------------------------------------------------------------------------------------
    def plan(self, batch: StepBatch) -> StepPlan:
        return plan_step(batch, self.config, self.world[self.local_ranks[0]].weights.parallel,
                         self.kernel, self.plan_cfg)

    @torch.inference_mode()
    def step(self, batch: StepBatch, mode: str = "queue", sms: int = 4, seed: int = 0,
             stream_hook=None) -> torch.Tensor:
        """Run one step; logits [num_seqs, V] float32 of each sequence's last token (all ranks'
        vocab shards, gathered). stream_hook(rank, instrs) -> instrs may alter a rank's int32
        stream before it runs (tests: drop a wait and see the random mode catch it)."""
        if mode not in ("queue", "random"):
            raise ValueError(f"unknown VM mode {mode!r} (queue or random)")
        base = self.plan(batch)
        self.last_plan = base
        queues: dict[int, _Queue] = {}
        for r in self.local_ranks:
            st = self.world[r]
            p = base.for_rank(r)
            st.meta = p.meta
            st.reset_activations()
            st.counters = [0] * p.num_counters
            instrs = p.instrs if stream_hook is None else stream_hook(r, p.instrs.clone())
            queues[r] = _Queue([Instruction.decode(w) for w in instrs.tolist()])
        rng = random.Random(seed)
        self._slots = {r: [] for r in queues}
        if self.distributed:
            self._run_distributed(queues, mode, sms, rng)
        else:
            self._run(queues, mode, sms, rng)
        for r in self.local_ranks:
            got = torch.tensor(self.world[r].counters, dtype=torch.int32)
            bad = (got != base.targets).nonzero().flatten().tolist()
            if bad:
                c = bad[0]
                raise VMError(f"rank {r}: {len(bad)} counters end off target, e.g. "
                              f"{base.describe_counter(c)} = {int(got[c])}, target {int(base.targets[c])}")
        return self._gather_logits(base.meta.num_seqs)

    # execution -----------------------------------------------------------------------------------
    def _ready(self, r: int, ins: Instruction) -> bool:
        cnt = self.world[r].counters
        # an unsplit folded GEMM tile's epilogue wait too: the VM runs an instruction whole
        for c, t in all_waits(ins):
            if cnt[c] < t:
                return False
        return True

    def _family(self, opcode: int):
        fam = self._families.get(opcode)
        if fam is None:
            fam = self._families[opcode] = family_of(opcode)
        return fam

    def _execute(self, r: int, ins: Instruction, outbox=None) -> None:
        st = self.world[r]
        self._family(ins.opcode).run_torch(ins, st)
        self.executed += 1
        if outbox is not None:
            for reg in instruction_accesses(ins, r, st.meta).writes:
                if reg.rank != r:
                    data = self.world[reg.rank].bufs[reg.buf][reg.row0:reg.row1, reg.col0:reg.col1].clone()
                    outbox.append(("w", reg.rank, reg.buf, reg.row0, reg.row1, reg.col0, reg.col1, data))
        if ins.signal < 0:
            return
        k = ins.signal_count
        if ins.signal_scope == SignalScope.LOCAL:
            targets = [r]
        elif ins.signal_scope == SignalScope.PEER:
            targets = [ins.signal_rank]
        else:
            targets = range(self.tp)
        for q in targets:
            if q in self.local_ranks:
                self.world[q].counters[ins.signal] += k
            elif outbox is not None:
                outbox.append(("s", q, ins.signal, k))
            else:
                raise VMError(f"rank {r} signals rank {q}, which does not exist")

    def _run(self, queues: dict[int, _Queue], mode: str, sms: int, rng: random.Random,
             outbox=None) -> bool:
        """Run until every queue is done (True) or nothing can run (False)."""
        if mode == "queue":
            while True:
                progressed = False
                for r, q in queues.items():
                    while q.head < len(q.instrs) and self._ready(r, q.instrs[q.head]):
                        self._execute(r, q.instrs[q.head], outbox)
                        q.head += 1
                        progressed = True
                if all(q.head == len(q.instrs) for q in queues.values()):
                    return True
                if not progressed:
                    if outbox is None:
                        self._stall(queues, {r: [q.head] for r, q in queues.items()})
                    return False
        # random mode: each rank holds `sms` slots (instruction indices)
        slots = self._slots
        while True:
            for r, q in queues.items():
                while len(slots[r]) < sms and q.head < len(q.instrs):
                    slots[r].append(q.head)
                    q.head += 1
            ready = [(r, i) for r, held in slots.items() for i in held
                     if self._ready(r, queues[r].instrs[i])]
            if not ready:
                if all(not held for held in slots.values()):
                    return True
                if outbox is None:
                    self._stall(queues, slots)
                return False
            r, i = ready[rng.randrange(len(ready))]
            slots[r].remove(i)
            self._execute(r, queues[r].instrs[i], outbox)

    def _stall(self, queues, held) -> None:
        plan = self.last_plan
        lines = []
        for r, idxs in held.items():
            for i in idxs:
                if i >= len(queues[r].instrs):
                    continue
                ins = queues[r].instrs[i]
                cnt = self.world[r].counters
                waits = ", ".join(f"{plan.describe_counter(c)} = {cnt[c]} (target {t})"
                                  for c, t in all_waits(ins) if cnt[c] < t)
                lines.append(f"  rank {r} instruction {i} {op_name(ins.opcode)} layer {ins.layer} "
                             f"rows {ins.row0}+{ins.rows} cols {ins.col0}+{ins.cols}: waits {waits}")
        raise VMStall("VM stalled: no instruction can run\n" + "\n".join(lines))

    def _run_distributed(self, queues, mode, sms, rng) -> None:
        import torch.distributed as dist
        (r,) = queues
        while True:
            outbox: list = []
            done = self._run(queues, mode, sms, rng, outbox)
            msgs = [None] * self.tp
            dist.all_gather_object(msgs, (done, len(outbox), outbox), group=self.group)
            for _, _, box in msgs:
                for m in box:
                    if m[0] == "w" and m[1] == r:
                        _, _, b, r0, r1, c0, c1, data = m
                        self.world[r].bufs[b][r0:r1, c0:c1].copy_(data)
            for _, _, box in msgs:
                for m in box:
                    if m[0] == "s" and m[1] == r:
                        self.world[r].counters[m[2]] += m[3]
            if all(d for d, _, _ in msgs):
                return
            if not any(n for _, n, _ in msgs) and not done:
                held = self._slots[r] if mode == "random" else [queues[r].head]
                self._stall(queues, {r: held})

    def _gather_logits(self, num_seqs: int) -> torch.Tensor:
        parts = [self.world[r].bufs[Buf.LOGITS][:num_seqs].clone() for r in self.local_ranks]
        if self.distributed:
            import torch.distributed as dist
            full = [torch.empty_like(parts[0]) for _ in range(self.tp)]
            dist.all_gather(full, parts[0].contiguous(), group=self.group)
            parts = full
        return torch.cat(parts, dim=-1).float()

    # KV cache views (for tests and tools) -------------------------------------------------------
    def kv_cache(self, rank: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of `rank` as [L, num_pages, page_size, kv_heads, D] views."""
        cfg = self.config
        st = self.world[rank]
        shape = (cfg.num_layers, self.kernel.kv_pages, self.kernel.page_size, -1, cfg.head_dim)
        return st.bufs[Buf.K_CACHE].view(shape), st.bufs[Buf.V_CACHE].view(shape)


# mk.engine backend ----------------------------------------------------------------------------------
class VMBackend:
    """The interpreter as an mk.engine backend: one rank per process (TP through `group`)."""

    name = "vm"

    def __init__(self, weights: RankWeights, kernel: KernelConfig, group=None, *,
                 owns_weights: bool = False):
        env = os.environ
        cfg = {}
        if env.get("MK_VM_POLICY"):
            cfg["policy"] = env["MK_VM_POLICY"]
        if env.get("MK_VM_KV_SPLIT"):
            cfg["kv_split"] = int(env["MK_VM_KV_SPLIT"])
        if env.get("MK_VM_SPLIT_K"):
            cfg["split_k"] = int(env["MK_VM_SPLIT_K"])
        if env.get("MK_VM_NORM_FOLD"):
            cfg["norm_fold"] = int(env["MK_VM_NORM_FOLD"])
            if cfg["norm_fold"]:
                weights = fold_norms(weights)
        self.mode = env.get("MK_VM_MODE", "queue")
        self.sms = int(env.get("MK_VM_SMS", "4"))
        self.seed = int(env.get("MK_VM_SEED", "0"))
        self.vm = VM([weights], kernel, PlanConfig(**cfg), group=group, device=weights.qkv.device)
        self.steps = 0

    def forward(self, batch: StepBatch) -> torch.Tensor:
        self.steps += 1
        return self.vm.step(batch, mode=self.mode, sms=self.sms, seed=self.seed + self.steps)


def _register() -> None:
    try:
        from mk.engine import register_backend
    except ImportError:     # the engine is optional for the interpreter itself
        return
    register_backend("vm")(VMBackend)


_register()
