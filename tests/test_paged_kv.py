"""Paged KV cache, page manager and the engine's batching/sampling on the reference backend.

Incremental decoding (chunked prefill with start_pos > 0, then one token per step) through
shuffled, non-contiguous page tables must give the logits of a full recompute of each prefix.
"""

from __future__ import annotations

import random

import pytest
import torch

from conftest import GQA_LLAMA3, make_hf_checkpoint
from mk.batch import SeqChunk, StepBatch
from mk import engine as mke
from mk.engine import Engine, OutOfPagesError, PageManager, available_backends, create_backend
from mk.reference import PagedKVCache
from mk.sampling import SamplingParams, filter_logits, sample

PAGE = 4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_hf_checkpoint(tmp_path_factory.mktemp("gqa"), **GQA_LLAMA3)[0]


@pytest.fixture(scope="module")
def engine(ckpt):
    return Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", page_size=PAGE,
                                  num_kv_pages=96, progress=False)


def shuffled_tables(num_pages: int, sizes: list[int], seed: int = 0) -> list[list[int]]:
    ids = list(range(num_pages))
    random.Random(seed).shuffle(ids)
    out = []
    for n in sizes:
        out.append(ids[:n])
        ids = ids[n:]
    return out


def test_cache_append_gather_roundtrip():
    cache = PagedKVCache(num_layers=2, num_pages=10, page_size=PAGE, kv_heads=2, head_dim=8,
                         dtype=torch.float32)
    pages = [7, 2, 9]
    k = torch.randn(11, 2, 8)
    v = torch.randn(11, 2, 8)
    cache.append(1, cache.slots(pages, 0, 5), k[:5], v[:5])      # a chunk
    cache.append(1, cache.slots(pages, 5, 11), k[5:], v[5:])     # the next, crossing pages
    kk, vv = cache.gather(1, cache.slots(pages, 0, 11))
    assert torch.equal(kk, k) and torch.equal(vv, v)
    assert torch.equal(cache.k[1, 2, 1], k[5])                   # position 5 = page 1 slot 1 -> id 2
    with pytest.raises(ValueError, match="cannot hold position"):
        cache.slots(pages, 0, 13)


@torch.inference_mode()
def test_incremental_decode_equals_full_recompute(engine):
    V = engine.config.vocab_size
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, V, (19,), generator=g).tolist(),
            torch.randint(0, V, (13,), generator=g).tolist()]
    prompt_len = [7, 2]
    # page tables of the incremental runs and of every recompute, shuffled over the whole pool
    need = [-(-len(s) // PAGE) for s in seqs]
    tables = shuffled_tables(engine.kernel.kv_pages, need * 2, seed=3)
    inc_tables, full_tables = tables[:2], tables[2:]

    inc = {0: {}, 1: {}}          # seq -> {position: logits of the token at that position}
    # step 1: seq 0 prefills its first 3 prompt tokens, seq 1 its whole prompt
    out = engine.step(StepBatch([SeqChunk(seqs[0][:3], 0, inc_tables[0]),
                                 SeqChunk(seqs[1][:2], 0, inc_tables[1])]))
    inc[1][1] = out[1]
    # step 2: seq 0 finishes its prompt (start_pos 3 > 0), seq 1 decodes
    out = engine.step(StepBatch([SeqChunk(seqs[0][3:7], 3, inc_tables[0]),
                                 SeqChunk(seqs[1][2:3], 2, inc_tables[1])]))
    inc[0][6], inc[1][2] = out[0], out[1]
    pos = [7, 3]
    while pos[0] < len(seqs[0]) or pos[1] < len(seqs[1]):
        live = [i for i in (1, 0) if pos[i] < len(seqs[i])]        # order differs from above
        out = engine.step(StepBatch([SeqChunk([seqs[i][pos[i]]], pos[i], inc_tables[i]) for i in live]))
        for row, i in enumerate(live):
            inc[i][pos[i]] = out[row]
            pos[i] += 1

    for i, s in enumerate(seqs):
        assert sorted(inc[i]) == list(range(prompt_len[i] - 1, len(s)))
        for t, got in inc[i].items():
            full = engine.step(StepBatch([SeqChunk(s[:t + 1], 0, full_tables[i])]))[0]
            torch.testing.assert_close(got, full, atol=2e-5, rtol=0,
                                       msg=lambda m: f"seq {i} position {t}: {m}")


def test_page_manager_allocates_frees_and_errors_clearly():
    pm = PageManager(num_pages=5, page_size=4)
    a = pm.allocate("a", 9)                 # 3 pages
    assert len(a) == 3 and pm.free_pages == 2
    assert pm.allocate("a", 12) == a        # still 3 pages
    b = pm.allocate("b", 8)
    assert len(b) == 2 and not set(a) & set(b) and pm.free_pages == 0
    with pytest.raises(OutOfPagesError, match=r"out of pages.*'c' needs 1 more page.*0 of 5 are free"):
        pm.allocate("c", 1)
    pm.free("a")
    assert pm.free_pages == 3
    assert len(pm.allocate("c", 12)) == 3
    with pytest.raises(KeyError, match="holds no KV pages"):
        pm.pages("a")


def test_batch_with_short_page_table_is_refused(engine):
    with pytest.raises(ValueError, match="needs 2 KV pages"):
        engine.step(StepBatch([SeqChunk([1, 2, 3, 4, 5], 0, [0])]))
    with pytest.raises(ValueError, match="outside"):
        engine.step(StepBatch([SeqChunk([1], 0, [10_000])]))


def test_generate_out_of_pages_is_clear(ckpt):
    small = Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", page_size=PAGE,
                                   num_kv_pages=4, progress=False)
    with pytest.raises(OutOfPagesError, match="KV pages"):
        small.generate([[1] * 10], max_new_tokens=10)       # 19 tokens need 5 pages of 4


@torch.inference_mode()
def test_generate_waits_for_pages_and_chunks(engine, ckpt):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [1, 2], [40, 41, 42, 43, 44], [9]]
    want = engine.generate(prompts, max_new_tokens=6, ignore_eos=True)
    # room for about two sequences at a time, 3 tokens per step: admission waits, prefill chunks
    small = Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", page_size=PAGE,
                                   num_kv_pages=6, progress=False)
    got = small.generate(prompts, max_new_tokens=6, ignore_eos=True, max_tokens_per_step=3)
    assert got == want
    assert small.pages.free_pages == 6
    assert all(len(o) == 6 for o in got)


@torch.inference_mode()
def test_generate_stops_at_eos(engine):
    prompt = [[3, 1, 4, 1, 5]]
    free = engine.generate(prompt, max_new_tokens=8, ignore_eos=True)[0]
    stop = free[3]
    out = engine.generate(prompt, max_new_tokens=8, stop_token_ids=[stop])[0]
    assert out == free[:free.index(stop) + 1]


@torch.inference_mode()
def test_sampling_seeded_and_batch_independent(engine):
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    kw = dict(max_new_tokens=8, ignore_eos=True, temperature=1.0, top_k=20, top_p=0.9)
    a = engine.generate(prompts, seed=11, **kw)
    assert engine.generate(prompts, seed=11, **kw) == a
    assert engine.generate(prompts, seed=12, **kw) != a
    # a sequence's draws do not depend on its batch mates (one generator per sequence)
    assert engine.generate(prompts[:1], seed=11, **kw)[0] == a[0]


def test_sampling_filters():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert sample(logits, SamplingParams()).tolist() == [1]
    k2 = filter_logits(logits, top_k=2)
    assert torch.isinf(k2[0, [0, 3]]).all() and torch.isfinite(k2[0, [1, 2]]).all()
    p = filter_logits(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), top_p=0.7)
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_sample_rows_draws_only_the_wanted_rows():
    """sample_rows (the engine's sampler, no device index copies): the wanted rows draw what
    one row at a time would, from their own generators only; greedy: argmax of every row."""
    from mk.sampling import make_generator, sample_rows
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.9)
    rows = [0, 2, 4]
    got = sample_rows(logits, rows, params, [make_generator(3, j) for j in rows])
    for j in rows:
        probs = torch.softmax(filter_logits(logits[j:j + 1] / 0.7, 10, 0.9), -1)[0]
        assert int(got[j]) == int(torch.multinomial(probs, 1, generator=make_generator(3, j)))
    assert got[[1, 3]].tolist() == [0, 0]
    assert torch.equal(sample_rows(logits, rows, SamplingParams()), logits.argmax(-1))
    with pytest.raises(ValueError, match="one generator per sampled row"):
        sample_rows(logits, rows, params, [make_generator(3, 0)])


def test_backend_registry(engine):
    assert "reference" in available_backends()
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; known backends: reference"):
        create_backend("nope", engine.weights, engine.kernel)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        engine.generate([[]], max_new_tokens=2)


def test_backends_learn_whether_they_own_the_weights(ckpt):
    """Engine.from_pretrained's weights are the engine's alone: its backend is told it owns them
    (the megakernel then folds its norm weights into them in place instead of into a ~11 GB copy
    at the 70B TP8 rank); weights a caller hands to Engine(...) stay the caller's."""
    from mk import engine as mke

    seen = []

    class Recording(mke.ReferenceBackend):
        def __init__(self, weights, kernel, group=None, *, owns_weights=False):
            seen.append((weights, owns_weights))
            super().__init__(weights, kernel, group)
    mke.register_backend("recording")(Recording)
    try:
        e = Engine.from_pretrained(ckpt, backend="recording", dtype=torch.float32, device="cpu",
                                   page_size=PAGE, num_kv_pages=8, progress=False)
        assert seen == [(e.weights, True)]
        Engine(e.weights, backend="recording", kernel=e.kernel)
        assert seen[1] == (e.weights, False)
        create_backend("recording", e.weights, e.kernel)
        assert seen[2][1] is False
    finally:
        del mke._BACKENDS["recording"]


def test_generate_stats_count_the_steps_and_the_backends_host_share(ckpt):
    """Engine.last_stats after generate(): sequences, prompt and new tokens, steps, wall time, and
    where a backend reports its host share of each step (the megakernel's last_prepare_s: plan,
    check, uploads), their sum; max_tokens_per_step 4 cuts the 7 prompt tokens over two steps."""
    from mk import engine as mke

    class Timed(mke.ReferenceBackend):
        def __init__(self, weights, kernel, group=None, *, owns_weights=False):
            super().__init__(weights, kernel, group)
            self.last_prepare_s = None

        def forward(self, batch):
            self.last_prepare_s = 0.25
            return super().forward(batch)
    mke.register_backend("timed")(Timed)
    try:
        e = Engine.from_pretrained(ckpt, backend="timed", dtype=torch.float32, device="cpu",
                                   page_size=PAGE, num_kv_pages=8, progress=False)
        out = e.generate([[5, 6, 7], [8, 9, 10, 11]], max_new_tokens=3, ignore_eos=True,
                         max_tokens_per_step=4)
        st = e.last_stats
        assert [len(o) for o in out] == [3, 3]
        assert (st.sequences, st.prompt_tokens, st.new_tokens) == (2, 7, 6)
        assert st.steps >= 4 and st.prepare_s == pytest.approx(0.25 * st.steps)
        assert st.wall_s > 0 and st.new_tokens_per_s == pytest.approx(6 / st.wall_s)
        assert "2 sequences, 7 prompt + 6 new tokens in" in st.summary()
        assert "host planning" in st.summary()
    finally:
        del mke._BACKENDS["timed"]


class _Overlapped:
    """A backend with the megakernel's split step (plan_step / run_step / finish) over the
    reference backend: run_step fills the late tokens into the planned batch and computes it;
    `log` records the calls, `batches` what each step ran. runs_ahead: run_step(ahead=True)
    queues a step behind the one "in flight" (its late tokens read from that step's sampled
    tokens, `late`), as the megakernel's backend does."""

    def __init__(self, ref, fail_at: int | None = None, runs_ahead: bool = False):
        self.ref, self.fail_at, self.runs_ahead = ref, fail_at, runs_ahead
        self.log: list[str] = []
        self.batches: list[StepBatch] = []
        self.in_flight = 0
        self.on_run = lambda: None      # what a launch does to the backend's own buffers

    def forward(self, batch):
        raise AssertionError("an overlapping engine calls plan_step / run_step / finish")

    def plan_step(self, batch):
        self.log.append("plan")
        return batch

    def run_step(self, batch, tokens=None, late=None, ahead=False):
        assert self.runs_ahead or not (ahead or late)
        self.finish(keep=1 if ahead else 0)
        self.log.append("ahead" if ahead else "run")
        filled = dict(tokens or {})
        if late is not None:
            filled.update({j: int(late.tokens[r]) for j, r in late.rows.items()})
        for j, t in filled.items():
            assert len(batch.seqs[j].tokens) == 1       # late tokens are decodes' only
            batch.seqs[j].tokens[0] = t
        self.batches.append(batch)
        self.in_flight += 1
        self.on_run()
        return self.ref.forward(batch)

    def finish(self, keep: int = 0):
        while self.in_flight > keep:
            self.in_flight -= 1
            self.log.append("finish")
            if self.fail_at is not None and self.log.count("finish") == self.fail_at:
                raise RuntimeError("step failed on the device")


def _overlapped_engine(ckpt, num_kv_pages=96, fail_at=None, runs_ahead=False):
    e = Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", page_size=PAGE,
                               num_kv_pages=num_kv_pages, progress=False)
    e.backend = _Overlapped(e.backend, fail_at, runs_ahead)
    return e


@torch.inference_mode()
def test_overlapped_generation_gives_the_same_tokens(engine, ckpt):
    """A backend with a split step has step n + 1 planned before step n is finished (its decode
    tokens filled in at run_step) and gives the tokens of one step at a time: with admission
    waiting for pages and prompts chunked over steps, with a stop token that ends a sequence
    while its next step is planned (that row is computed and dropped), and sampled."""
    prompts = [[5, 6, 7, 8, 9, 10, 11], [1, 2], [40, 41, 42, 43, 44], [9]]
    kw = dict(max_new_tokens=6, max_tokens_per_step=3)
    free = engine.generate(prompts, ignore_eos=True, **kw)
    stop = free[1][2]                   # the third token of prompt 1 stops it
    for extra in (dict(ignore_eos=True), dict(stop_token_ids=[stop]),
                  dict(ignore_eos=True, temperature=1.0, top_k=20, seed=3)):
        want = engine.generate(prompts, **kw, **extra)
        e = _overlapped_engine(ckpt, num_kv_pages=6)
        got = e.generate(prompts, **kw, **extra)
        assert got == want, extra
        assert e.pages.free_pages == 6
        log = e.backend.log
        # every plan after the first came while the step before it was still in flight
        assert log[:2] == ["plan", "run"] and log[-1] == "finish"
        runs = [i for i, x in enumerate(log) if x == "run"]
        for a, b in zip(runs, runs[1:]):
            # (a step whose sequences the step before all stopped is planned, then not run)
            assert log[a + 1:b] in (["plan", "finish"], ["plan", "finish", "plan"])
    # the stopped sequence (prompt 1, 2 tokens) ran one step past its stop token: that step's
    # row fed the stop token back once, and no step after it held the sequence
    e = _overlapped_engine(ckpt, num_kv_pages=6)
    k = free[1].index(stop)
    assert e.generate(prompts, stop_token_ids=[stop], **kw)[1] == free[1][:k + 1]
    batches = e.backend.batches
    first = next(i for i, b in enumerate(batches) for c in b.seqs if c.tokens == prompts[1])
    pages1 = next(c.pages for c in batches[first].seqs if c.tokens == prompts[1])
    held = [(i, c) for i, b in enumerate(batches) for c in b.seqs
            if c.pages == pages1 and c.start_pos >= 2]
    assert [c.start_pos for _, c in held] == list(range(2, 2 + k + 1))
    assert held[-1][1].tokens == [stop]


@torch.inference_mode()
def test_overlapped_generation_runs_no_step_after_the_last_stop(engine, ckpt):
    """A step planned while the step before runs, whose every sequence that step's tokens stop,
    is not run: a prompt stopped by its token takes as many launches as one step at a time,
    alone and beside a second prompt."""
    free = engine.generate([[5, 6, 7]], max_new_tokens=8, ignore_eos=True)[0]
    # a token first seen after the first (the prompt's step gives token 0)
    k = next(i for i, t in enumerate(free) if i >= 1 and free.index(t) == i)
    stop = free[k]
    e = _overlapped_engine(ckpt)
    assert e.generate([[5, 6, 7]], max_new_tokens=8, stop_token_ids=[stop]) == [free[:k + 1]]
    assert e.backend.log.count("run") == k + 1 == e.last_stats.steps
    assert e.backend.log.count("plan") == k + 2     # the stopped sequence's next step
    assert e.pages.free_pages == e.pages.num_pages
    # beside a sequence still running, a stopped one's row is dropped in a step that runs anyway
    two = [[5, 6, 7], [9, 8, 7, 6]]
    want = engine.generate(two, max_new_tokens=8, stop_token_ids=[stop])
    e = _overlapped_engine(ckpt)
    assert e.generate(two, max_new_tokens=8, stop_token_ids=[stop]) == want
    assert e.backend.log.count("run") == e.last_stats.steps == engine.last_stats.steps
    assert e.pages.free_pages == e.pages.num_pages


@torch.inference_mode()
def test_overlapped_generation_failure_frees_the_pages(ckpt):
    """A step that fails on the device raises from generate (at the next step's finish) and the
    engine's pages all come back."""
    e = _overlapped_engine(ckpt, fail_at=3)
    with pytest.raises(RuntimeError, match="step failed on the device"):
        e.generate([[5, 6, 7], [8, 9]], max_new_tokens=8, ignore_eos=True)
    assert e.pages.free_pages == e.pages.num_pages
    # overlap off: one step at a time through forward
    e = Engine.from_pretrained(ckpt, dtype=torch.float32, device="cpu", page_size=PAGE,
                               num_kv_pages=96, progress=False)
    ref = e.generate([[5, 6, 7]], max_new_tokens=3, ignore_eos=True)
    e.backend = _Overlapped(e.backend)
    with pytest.raises(AssertionError, match="plan_step"):
        e.generate([[5, 6, 7]], max_new_tokens=3, ignore_eos=True, overlap=False)
    assert e.generate([[5, 6, 7]], max_new_tokens=3, ignore_eos=True) == ref


@pytest.fixture
def device_busy(monkeypatch):
    """The pending step's tokens "not read yet" when the engine asks (on the CPU the reference
    computes a step at once): `busy[0]` says, per ask, whether the step is still running."""
    busy = [lambda: True]
    monkeypatch.setattr(mke._GenerationRun, "pending_read", lambda self: not busy[0]())
    return busy


@torch.inference_mode()
def test_run_ahead_generation_gives_the_same_tokens(engine, ckpt, device_busy):
    """With a backend that runs ahead, step n + 1 is queued behind step n while it runs (its
    decode tokens gathered from step n's sampled tokens) and step n's tokens are read after:
    the tokens of one step at a time, with admission waiting for pages, chunked prompts, a stop
    token (the stopped sequence's row in the step queued behind is dropped) and sampling;
    whether the step before still runs or has ended at each step (random), or always runs."""
    prompts = [[5, 6, 7, 8, 9, 10, 11], [1, 2], [40, 41, 42, 43, 44], [9]]
    kw = dict(max_new_tokens=6, max_tokens_per_step=3)
    free = engine.generate(prompts, ignore_eos=True, **kw)
    stop = free[1][2]
    rng = random.Random(0)
    for busy in (lambda: True, lambda: rng.random() < 0.5):
        device_busy[0] = busy
        for extra in (dict(ignore_eos=True), dict(stop_token_ids=[stop]),
                      dict(ignore_eos=True, temperature=1.0, top_k=20, seed=3)):
            want = engine.generate(prompts, **kw, **extra)
            e = _overlapped_engine(ckpt, num_kv_pages=6, runs_ahead=True)
            got = e.generate(prompts, **kw, **extra)
            assert got == want, extra
            assert e.pages.free_pages == 6
            log, st = e.backend.log, e.last_stats
            assert st.ahead_steps == log.count("ahead") >= 1
            assert f"{st.ahead_steps} steps queued behind the one running" in st.summary()
            assert log.count("ahead") + log.count("run") == st.steps
            assert log.count("finish") == st.steps and e.backend.in_flight == 0
            if busy() is True and "temperature" not in extra:
                # every step after the first went ahead of the read of the one before
                assert log[:2] == ["plan", "run"] and st.ahead_steps == st.steps - 1
    # overlap="plan": the same backend plans ahead but launches after the read
    device_busy[0] = lambda: True
    e = _overlapped_engine(ckpt, num_kv_pages=6, runs_ahead=True)
    assert e.generate(prompts, overlap="plan", ignore_eos=True, **kw) == free
    assert "ahead" not in e.backend.log and e.last_stats.ahead_steps == 0
    with pytest.raises(ValueError, match="overlap must be"):
        e.generate(prompts, overlap="ahead", **kw)


def test_generate_steps_run_in_inference_mode(ckpt, device_busy):
    """A buffer the backend made in an inference-mode forward() (an inference tensor, as the
    megakernel's launch records were when a teacher-forced forward came first) is updated in
    place by generate's steps, called outside inference mode: generate runs in inference mode
    whatever its caller's mode (session 63's GPU run failed on this)."""
    assert not torch.is_inference_mode_enabled()
    with torch.inference_mode():
        made_by_forward = torch.zeros(1)
    for overlap in (True, "plan", False):
        e = _overlapped_engine(ckpt, runs_ahead=True)
        if overlap is False:
            e.backend.forward = lambda batch, b=e.backend: (b.run_step(batch), b.finish())[0]
        e.backend.on_run = lambda: made_by_forward.add_(1)
        before = int(made_by_forward)
        e.generate([[5, 6, 7]], max_new_tokens=4, ignore_eos=True, overlap=overlap)
        assert int(made_by_forward) - before == e.last_stats.steps == 4


@torch.inference_mode()
def test_run_ahead_generation_runs_one_step_past_the_last_stop(engine, ckpt, device_busy):
    """Queued before the stop token is read, the step after a lone prompt's stop runs (its row
    dropped): one launch more than one step at a time; with the device idle when asked (the
    step before ended), none."""
    free = engine.generate([[5, 6, 7]], max_new_tokens=8, ignore_eos=True)[0]
    k = next(i for i, t in enumerate(free) if i >= 1 and free.index(t) == i)
    stop = free[k]
    for busy, launches in ((lambda: True, k + 2), (lambda: False, k + 1)):
        device_busy[0] = busy
        e = _overlapped_engine(ckpt, runs_ahead=True)
        assert e.generate([[5, 6, 7]], max_new_tokens=8, stop_token_ids=[stop]) == [free[:k + 1]]
        assert e.last_stats.steps == launches == len(e.backend.batches)
        assert e.pages.free_pages == e.pages.num_pages


@torch.inference_mode()
def test_run_ahead_failure_frees_the_pages(ckpt, device_busy):
    """A step that fails on the device while the next one is queued behind it raises from
    generate, the queued one is finished too, and the engine's pages all come back."""
    e = _overlapped_engine(ckpt, fail_at=3, runs_ahead=True)
    with pytest.raises(RuntimeError, match="step failed on the device"):
        e.generate([[5, 6, 7], [8, 9]], max_new_tokens=8, ignore_eos=True)
    assert e.pages.free_pages == e.pages.num_pages and e.backend.in_flight == 0
