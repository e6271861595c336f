"""The backend API: KV page manager, continuous batching, sampling, generate / step.

    engine = Engine.from_pretrained(model_dir)              # TP over the torch.distributed world
    outs = engine.generate(prompts, max_new_tokens=64)      # list of new token ids per prompt
    logits = engine.step(batch)                             # one StepBatch -> [num_seqs, V] float32

Backends
--------
A backend runs one step: `forward(batch: StepBatch) -> logits [num_seqs, vocab] float32` of each
sequence's last new token, the full vocabulary on every rank. It owns its KV cache of
`kernel.kv_pages` pages of `kernel.page_size` tokens; the engine owns the page ids (PageManager)
and hands each sequence's page table in SeqChunk.pages.

Backends are created by name through a registry: a module registers a factory with

    @register_backend("vm")
    def make_vm_backend(weights: RankWeights, kernel: KernelConfig, group, *,
                        owns_weights: bool = False) -> Backend: ...

owns_weights: no one else holds `weights` (Engine.from_pretrained loaded them for this engine), so
the backend may change them in place (the megakernel folds its norm weights into them instead of
into a copy, mk.weights.fold_norms); otherwise it must leave the caller's tensors as they are.

"reference" (mk.reference, plain torch) is built in; "vm" (mk.vm) and "megakernel"
(mk.megakernel_step) are imported on first use when their modules exist, and must register themselves
on import.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, runtime_checkable

import torch

from mk.batch import SeqChunk, StepBatch
from mk.config import KernelConfig, ModelConfig, ParallelConfig
from mk.sampling import SamplingParams, broadcast_tokens, make_generator, sample_rows
from mk.weights import RankWeights


# KV pages ------------------------------------------------------------------------------------------
class OutOfPagesError(RuntimeError):
    """The KV cache has too few free pages for a request."""


class PageManager:
    """Hands out KV cache page ids to sequences; pages return to the pool when a sequence is freed."""

    def __init__(self, num_pages: int, page_size: int):
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"PageManager needs positive sizes, got {num_pages} pages of {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(num_pages))
        self._tables: dict[object, list[int]] = {}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def can_allocate(self, seq_id, num_tokens: int) -> bool:
        have = len(self._tables.get(seq_id, ()))
        return self.pages_for(num_tokens) - have <= len(self._free)

    def allocate(self, seq_id, num_tokens: int) -> list[int]:
        """Grow seq_id's page table to cover num_tokens tokens; returns the whole table."""
        table = self._tables.setdefault(seq_id, [])
        need = self.pages_for(num_tokens) - len(table)
        if need > len(self._free):
            if not table:
                del self._tables[seq_id]
            raise OutOfPagesError(
                f"KV cache out of pages: sequence {seq_id!r} needs {need} more page(s) of "
                f"{self.page_size} tokens for {num_tokens} tokens, {len(self._free)} of "
                f"{self.num_pages} are free (raise num_kv_pages / max_seqs x max_context, or "
                f"shorten the requests)")
        for _ in range(max(0, need)):
            table.append(self._free.popleft())
        return list(table)

    def pages(self, seq_id) -> list[int]:
        if seq_id not in self._tables:
            raise KeyError(f"sequence {seq_id!r} holds no KV pages")
        return list(self._tables[seq_id])

    def free(self, seq_id) -> None:
        for p in self._tables.pop(seq_id, []):
            self._free.append(p)


# Backends ------------------------------------------------------------------------------------------
@runtime_checkable
class Backend(Protocol):
    name: str

    def forward(self, batch: StepBatch) -> torch.Tensor:
        """logits [num_seqs, vocab_size] float32 of each sequence's last new token."""
        ...


BackendFactory = Callable[[RankWeights, KernelConfig, object], Backend]
_BACKENDS: dict[str, BackendFactory] = {}
# Backends whose module registers them on import (loaded on first use, listed when present).
_LAZY_BACKENDS = {"vm": "mk.vm", "megakernel": "mk.megakernel_step"}


def register_backend(name: str):
    """Decorator: register `factory(weights, kernel, group, *, owns_weights=False) -> Backend`
    under `name` (owns_weights: the module docstring)."""
    def deco(factory: BackendFactory) -> BackendFactory:
        _BACKENDS[name] = factory
        return factory
    return deco


def available_backends() -> list[str]:
    names = list(_BACKENDS)
    for name, module in _LAZY_BACKENDS.items():
        if name not in names:
            try:
                if importlib.util.find_spec(module) is not None:
                    names.append(name)
            except (ImportError, ValueError):
                pass
    return names


def create_backend(name: str, weights: RankWeights, kernel: KernelConfig, group=None, *,
                   owns_weights: bool = False) -> Backend:
    if name not in _BACKENDS and name in _LAZY_BACKENDS and name in available_backends():
        try:
            importlib.import_module(_LAZY_BACKENDS[name])
        except ImportError as e:
            raise ValueError(f"backend {name!r} is unavailable: importing {_LAZY_BACKENDS[name]} "
                             f"failed ({e})") from e
        if name not in _BACKENDS:
            raise ValueError(f"backend {name!r}: module {_LAZY_BACKENDS[name]} does not register it "
                             f"(decorate its factory with @mk.engine.register_backend({name!r}))")
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known backends: "
                         f"{', '.join(available_backends())}")
    return _BACKENDS[name](weights, kernel, group, owns_weights=owns_weights)


class ReferenceBackend:
    """The plain torch oracle (mk.reference) as a backend."""

    name = "reference"

    def __init__(self, weights: RankWeights, kernel: KernelConfig, group=None, *,
                 owns_weights: bool = False):
        from mk.reference import PagedKVCache, ReferenceModel
        self.kv_cache = PagedKVCache.for_weights(weights, kernel.kv_pages, kernel.page_size)
        self.model = ReferenceModel(weights, self.kv_cache, group=group)

    def forward(self, batch: StepBatch) -> torch.Tensor:
        return self.model.forward(batch)


register_backend("reference")(ReferenceBackend)


# Engine --------------------------------------------------------------------------------------------
@dataclass
class GenerateStats:
    """What one Engine.generate call did (Engine.last_stats; launch/generate.py prints it)."""
    sequences: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    wall_s: float = 0.0
    # the backend's host share of its steps (the megakernel's plan, check, uploads: its
    # last_prepare_s after each step), None where the backend does not report it
    prepare_s: float | None = None
    # ... and its launches' host time (the megakernel's last_launch_s), None likewise
    launch_s: float | None = None
    # steps queued behind the step before while it still ran (overlap=True with a backend that
    # runs ahead: the megakernel's)
    ahead_steps: int = 0

    @property
    def new_tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Prompt and new tokens through the model per second (each new token but the last of a
        sequence is fed back as a decode token)."""
        return (self.prompt_tokens + self.new_tokens) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> str:
        line = (f"{self.sequences} sequences, {self.prompt_tokens} prompt + {self.new_tokens} new "
                f"tokens in {self.steps} steps, {self.wall_s:.2f} s: {self.new_tokens_per_s:.1f} "
                f"new tokens/s ({self.tokens_per_s:.1f} tokens/s through the model)")
        if self.prepare_s is not None and self.wall_s > 0:
            line += (f"; the backend's host planning {self.prepare_s:.2f} s "
                     f"({100 * self.prepare_s / self.wall_s:.0f}% of the time)")
        if self.ahead_steps:
            line += f"; {self.ahead_steps} steps queued behind the one running"
        return line


@dataclass(eq=False)
class _Seq:
    index: int                      # position in the generate() call's prompt list
    prompt: list[int]
    generator: torch.Generator | None
    cached: int = 0                 # tokens whose K/V are in the cache
    out: list[int] = field(default_factory=list)
    admitted: bool = False
    done: bool = False

    @property
    def prefilling(self) -> bool:
        return self.cached < len(self.prompt)


def default_kernel_config(model: ModelConfig, **overrides) -> KernelConfig:
    """Modest defaults for the engine: 64 sequences of up to 4096 tokens (or the model's max)."""
    kw = dict(max_seqs=64, max_context=min(4096, model.max_position_embeddings))
    kw.update(overrides)
    return KernelConfig(**kw)


class Engine:
    """Generation over one backend, tensor-parallel over `group` (every rank runs the same calls)."""

    def __init__(self, weights: RankWeights, backend: str = "reference",
                 kernel: KernelConfig | None = None, group=None, owns_weights: bool = False):
        """owns_weights: nobody else uses `weights`, the backend may change them in place
        (from_pretrained's own; the module docstring)."""
        self.weights = weights
        self.config: ModelConfig = weights.config
        self.parallel: ParallelConfig = weights.parallel
        self.kernel = kernel or default_kernel_config(self.config)
        self.group = group
        self.device = weights.qkv.device
        self.backend_name = backend
        self.backend = create_backend(backend, weights, self.kernel, group,
                                      owns_weights=owns_weights)
        self.pages = PageManager(self.kernel.kv_pages, self.kernel.page_size)
        self.last_stats: GenerateStats | None = None

    @classmethod
    def from_pretrained(cls, model_dir, backend: str = "reference", dtype: torch.dtype = torch.bfloat16,
                        device=None, group=None, kernel: KernelConfig | None = None,
                        progress: bool | None = None, **kernel_overrides) -> "Engine":
        """Load rank r's shard of a HF Llama checkpoint and build the engine.

        TP: the given group, else the whole torch.distributed world when it is initialized, else
        one rank. device: default cuda:LOCAL_RANK when a GPU is visible, else the CPU.
        kernel_overrides: KernelConfig fields (page_size, num_kv_pages, max_seqs, max_context, ...).
        """
        from mk import dist as mkdist
        from mk import weights as mkweights
        if backend not in available_backends():
            raise ValueError(f"unknown backend {backend!r}; known backends: "
                             f"{', '.join(available_backends())}")
        group, tp, rank = mkdist.tp_group_and_rank(group)
        device = torch.device(device) if device is not None else mkdist.default_device()
        parallel = ParallelConfig(tp_size=tp, rank=rank)
        model = ModelConfig.from_pretrained(model_dir)
        parallel.validate_for(model)
        if kernel is None:
            kernel = default_kernel_config(model, **kernel_overrides)
        elif kernel_overrides:
            kernel = replace(kernel, **kernel_overrides)
        weights = mkweights.load_rank_weights(model_dir, parallel, dtype=dtype, device=device,
                                              progress=(rank == 0) if progress is None else progress)
        # the weights were loaded for this engine alone: its backend may change them in place
        return cls(weights, backend=backend, kernel=kernel, group=group, owns_weights=True)

    # one step --------------------------------------------------------------------------------------
    def step(self, batch: StepBatch) -> torch.Tensor:
        """Run one batch: logits [num_seqs, vocab_size] float32 of each sequence's last new token.

        The caller owns the page tables (e.g. from engine.pages.allocate).
        """
        self._validate(batch)
        return self.backend.forward(batch)

    def _validate(self, batch: StepBatch) -> None:
        batch.validate(self.kernel.page_size, self.kernel.kv_pages,
                       max_tokens=self.kernel.max_batch_tokens, max_context=self.kernel.max_context)
        if len(batch.seqs) > self.kernel.max_seqs:
            raise ValueError(f"batch has {len(batch.seqs)} sequences, over the maximum "
                             f"{self.kernel.max_seqs}")

    # generation ------------------------------------------------------------------------------------
    def _check_prompts(self, prompts, max_new_tokens: int) -> None:
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("generate() needs a non-empty list of prompts (lists of token ids)")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        V = self.config.vocab_size
        for i, p in enumerate(prompts):
            if not isinstance(p, (list, tuple)) or len(p) == 0:
                raise ValueError(f"prompt {i} is empty: every prompt needs at least one token id")
            bad = [t for t in p if not isinstance(t, int) or not 0 <= t < V]
            if bad:
                raise ValueError(f"prompt {i} has token ids outside [0, {V}): {bad[:8]}")
            total = len(p) + max_new_tokens
            if total > self.kernel.max_context:
                raise ValueError(f"prompt {i}: {len(p)} prompt tokens + {max_new_tokens} new tokens "
                                 f"exceed the maximum context {self.kernel.max_context}")
            if self.pages.pages_for(max(1, total - 1)) > self.pages.num_pages:
                raise OutOfPagesError(
                    f"prompt {i}: {total} tokens need {self.pages.pages_for(total - 1)} KV pages, the "
                    f"cache has {self.pages.num_pages} in all")

    def generate(self, prompts: list[list[int]], max_new_tokens: int = 32,
                 sampling: SamplingParams | None = None, *, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 ignore_eos: bool = False, stop_token_ids: list[int] | None = None,
                 max_tokens_per_step: int | None = None, overlap: bool | str = True
                 ) -> list[list[int]]:
        """New token ids of every prompt (EOS included when it stops a sequence).

        Continuous batching: each step holds one decode token of every running sequence, then
        prefill chunks of waiting prompts up to `max_tokens_per_step` tokens (default
        kernel.max_batch_tokens) and kernel.max_seqs sequences. A prompt is admitted when the KV
        pages for its whole request (prompt + max_new_tokens) are free, so an admitted sequence
        never runs out of pages; finished sequences free theirs at once.

        overlap: with a backend that plans a step apart from launching it (the megakernel), plan
        each step while the one before runs and, where the backend can, queue it on the device
        behind that one before reading its tokens (_GenerationRun); "plan": plan while the step
        before runs, launch once its tokens are read; False: one step at a time.
        """
        if overlap != "plan" and not isinstance(overlap, (bool, int)) or overlap not in (
                True, False, "plan"):
            raise ValueError(f"overlap must be True, False or 'plan', got {overlap!r}")
        overlap = overlap if overlap == "plan" else bool(overlap)
        params = sampling or SamplingParams()
        over = {k: v for k, v in dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                      seed=seed).items() if v is not None}
        if over:
            params = replace(params, **over)
        self._check_prompts(prompts, max_new_tokens)
        if max_new_tokens == 0:
            return [[] for _ in prompts]
        budget = max_tokens_per_step or self.kernel.max_batch_tokens
        if budget <= 0:
            raise ValueError(f"max_tokens_per_step must be positive, got {budget}")
        budget = min(budget, self.kernel.max_batch_tokens)
        stops = set(self.config.eos_token_id) if stop_token_ids is None else set(stop_token_ids)
        if ignore_eos:
            stops = set()
        seqs = [_Seq(i, list(p), None if params.greedy else
                     make_generator(params.seed, i, self.device)) for i, p in enumerate(prompts)]
        run = _GenerationRun(self, seqs, params, max_new_tokens, budget, stops, overlap)
        t_start = time.perf_counter()
        # one autograd mode for the whole run: the backends' forward() runs in inference mode,
        # and a buffer that one made lazily (an inference tensor) may not be updated in place
        # outside it (the megakernel's launch records, first made by a teacher-forced forward)
        with torch.inference_mode():
            try:
                run.loop()
            except BaseException:
                run.close(quiet=True)
                raise
            run.close()
        stats = run.stats
        stats.new_tokens = sum(len(s.out) for s in seqs)
        stats.wall_s = time.perf_counter() - t_start
        self.last_stats = stats
        return [s.out for s in seqs]


class _GenerationRun:
    """One Engine.generate call's continuous-batching loop over its sequences.

    With a backend that splits a step into plan_step (host only) / run_step (launch, not waited
    for) / finish (wait and check), such as the megakernel's, the loop overlaps the host and the
    device: step n + 1 is scheduled and planned while step n runs, its decode rows planned
    before step n's tokens are known. Where the backend runs ahead (runs_ahead: the
    megakernel's) and step n still runs, step n + 1 is queued on the device behind it, its
    decode tokens gathered there from step n's sampled tokens (run_step(late=, ahead=True)),
    and step n's tokens are read after: the device goes from step to step without waiting for
    the host. Otherwise (overlap="plan", or step n already ended) step n is read first and its
    tokens go in at run_step. A sequence that step n's token stops then still has its row in
    step n + 1: the row is computed and dropped, and its pages are freed before any later step
    can reuse them (the device runs the steps in order); a step n + 1 of such rows only is not
    run when step n was read before its launch. Another backend's step is read back before the
    next one is scheduled, as is every step with overlap off.
    """

    def __init__(self, engine: "Engine", seqs: list[_Seq], params: SamplingParams,
                 max_new_tokens: int, budget: int, stops: set[int], overlap: bool | str):
        self.engine, self.backend, self.seqs = engine, engine.backend, seqs
        self.params, self.max_new_tokens, self.budget, self.stops = (params, max_new_tokens,
                                                                     budget, stops)
        self.pipelined = bool(overlap) and all(callable(getattr(self.backend, name, None))
                                               for name in ("plan_step", "run_step", "finish"))
        # queue step n + 1 behind step n on the device (run_step(ahead=True), its late tokens
        # gathered there) before step n's tokens are read
        self.ahead = (self.pipelined and overlap is True
                      and getattr(self.backend, "runs_ahead", False))
        self.waiting = deque(seqs)      # not yet fully prefilled, in arrival order
        self.running: list[_Seq] = []   # prefilled, decoding
        # the last launched step whose tokens are not read yet: [(logits row, seq, index in
        # seq.out)], its tokens (host), the event after their copy (None: already on the host),
        # its tokens on the device
        self.pending = None
        self.stats = GenerateStats(sequences=len(seqs),
                                   prompt_tokens=sum(len(s.prompt) for s in seqs))
        # page-locked token buffers, two so that step n + 1's copy never overwrites step n's
        # before it is read; allocated before any launch (a page-locked allocation waits for the
        # device's running work)
        self._host_tokens = ([torch.empty(engine.kernel.max_seqs, dtype=torch.long,
                                          pin_memory=True) for _ in range(2)]
                             if engine.device.type == "cuda" else None)

    def key(self, s: _Seq):
        return ("gen", id(self.engine), s.index)

    def loop(self) -> None:
        while True:
            if not self.pipelined:
                self.resolve()
            if not (self.waiting or self.running):
                break
            # (overlapped, the pending step's stops are not known yet, but a sequence it may
            # stop is still running, so the step is never empty for want of its pages)
            chunks, late = self.schedule()
            if not chunks:
                pages = self.engine.pages
                raise OutOfPagesError(f"cannot schedule any sequence: {pages.free_pages} of "
                                      f"{pages.num_pages} KV pages free")
            batch = StepBatch([c for _, c in chunks])
            if self.pipelined:
                self.engine._validate(batch)
                prepared = self.backend.plan_step(batch)    # while the last step runs
                if self.ahead and self.stats.steps and not self.pending_read():
                    # step n may still run: queue this one behind it, its decode tokens
                    # gathered from step n's sampled tokens on the device, then read step n's
                    logits = self.backend.run_step(prepared, late=self.late_tokens(late),
                                                   ahead=True)
                    self.resolve(keep=1)
                    self.stats.ahead_steps += 1
                else:
                    self.resolve()
                    if all(s.done for s, _ in chunks):
                        # the last step's tokens stopped every sequence of this one: it would
                        # only compute dropped rows (at the end of a job, a whole step for
                        # nothing)
                        continue
                    logits = self.backend.run_step(prepared, {j: s.out[-1] for j, s in late})
            else:
                logits = self.engine.step(batch)
            st = self.stats
            st.steps += 1
            prep, launch = (getattr(self.backend, n, None)
                            for n in ("last_prepare_s", "last_launch_s"))
            if prep is not None:
                st.prepare_s = (st.prepare_s or 0.0) + prep
            if launch is not None:
                st.launch_s = (st.launch_s or 0.0) + launch
            self.launched(chunks, logits)
        self.resolve()

    def schedule(self) -> tuple[list[tuple[_Seq, SeqChunk]], list[tuple[int, _Seq]]]:
        """The next step's chunks: one decode token of every running sequence, then prefill
        chunks of waiting prompts (admitted FIFO while their whole request's pages are free);
        and the decodes whose token is not known yet, as (index in the step, sequence)."""
        pages, max_seqs = self.engine.pages, self.engine.kernel.max_seqs
        chunks: list[tuple[_Seq, SeqChunk]] = []
        late: list[tuple[int, _Seq]] = []
        room = self.budget
        for s in self.running:
            if room == 0 or len(chunks) == max_seqs:
                break
            token = s.out[-1]
            if token is None:
                late.append((len(chunks), s))
                token = 0
            chunks.append((s, SeqChunk([token], s.cached, pages.pages(self.key(s)))))
            room -= 1
        for s in list(self.waiting):
            if room == 0 or len(chunks) == max_seqs:
                break
            if not s.admitted:
                need = len(s.prompt) + self.max_new_tokens - 1
                if not pages.can_allocate(self.key(s), need):
                    break               # wait for running sequences to free pages (FIFO)
                pages.allocate(self.key(s), need)
                s.admitted = True
            n = min(room, len(s.prompt) - s.cached)
            chunks.append((s, SeqChunk(s.prompt[s.cached:s.cached + n], s.cached,
                                       pages.pages(self.key(s)))))
            room -= n
        return chunks, late

    def launched(self, chunks, logits: torch.Tensor) -> None:
        """Advance the sequences past a launched step (their new tokens as placeholders) and
        queue its sampling: the tokens reach the host at resolve()."""
        rows = [j for j, (s, c) in enumerate(chunks) if not s.done and c.end_pos >= len(s.prompt)]
        for s, c in chunks:
            if not s.done:
                s.cached = c.end_pos
        targets = []
        for j in rows:
            s = chunks[j][0]
            if s in self.waiting:
                self.waiting.remove(s)
                self.running.append(s)
            s.out.append(None)
            targets.append((j, s, len(s.out) - 1))
            if len(s.out) >= self.max_new_tokens:
                self.finished(s)        # its pages go to steps after this one
        if not rows:
            return
        gens = None if self.params.greedy else [chunks[j][0].generator for j in rows]
        tokens = sample_rows(logits, rows, self.params, gens)
        tokens = broadcast_tokens(tokens, self.engine.group, self.engine.device)
        event, on_device = None, tokens
        if self._host_tokens is not None and tokens.is_cuda:
            host = self._host_tokens[self.stats.steps % 2][:tokens.shape[0]]
            host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            tokens = host
        self.pending = (targets, tokens, event, on_device)

    def pending_read(self) -> bool:
        """Whether the pending step's tokens are on the host already (its launch ended); False
        without a pending step (one that sampled nothing, a prompt's chunk: it may still run)."""
        if self.pending is None:
            return False
        event = self.pending[2]
        return event is None or event.query()

    def late_tokens(self, late: list[tuple[int, _Seq]]):
        """The next step's late decode tokens as rows of the pending step's device tokens."""
        from mk.megakernel_step import LateTokens
        if self.pending is None:
            return None
        targets, _, _, on_device = self.pending
        row_of = {id(s): j for j, s, _ in targets}
        return LateTokens(on_device, {j: row_of[id(s)] for j, s in late})

    def resolve(self, keep: int = 0) -> None:
        """Read the pending step's tokens (waiting for it) into its sequences; a stop token ends
        its sequence. keep: the backend's launches left in flight (1: a step queued behind the
        pending one)."""
        if self.pending is None:
            return
        targets, tokens, event, _ = self.pending
        self.pending = None
        if self.pipelined and keep:
            self.backend.finish(keep=keep)  # the step queued behind stays in flight
        elif self.pipelined:
            self.backend.finish()           # bounded: a hung or failed launch raises here
        if event is not None:
            event.synchronize()
        values = tokens.tolist()
        for j, s, k in targets:
            t = int(values[j])
            s.out[k] = t
            if t in self.stops and not s.done:
                self.finished(s)

    def finished(self, s: _Seq) -> None:
        s.done = True
        if s in self.running:
            self.running.remove(s)
        self.engine.pages.free(self.key(s))

    def close(self, quiet: bool = False) -> None:
        """Finish the backend's last launch (errors ignored when quiet: another is on its way)
        and free every sequence's pages."""
        try:
            if self.pipelined:
                try:
                    self.backend.finish()
                except Exception:
                    if not quiet:
                        raise
        finally:
            for s in self.seqs:
                self.engine.pages.free(self.key(s))
