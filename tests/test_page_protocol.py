"""A model of the megakernel's page-ring protocol (full / done / empty mbarriers per page of the
shared-memory pool), run under random interleavings of the loader, consumer and storer roles.

What the device code does and this model repeats, role by role (mk/instructions/_gemm_kernel.py,
_rows_kernel.py, _attention_kernel.py): every role walks the same pages in ring order; the loader
and the consumers wait full / empty with the ring generation's parity; the storer waits done
with its own per-page parity bits (rk.wait_done). An mbarrier parity wait passes when the
barrier's current phase parity differs from the one asked for, so it cannot tell phase u from
u - 2: the model checks, at every wait that passes, that the phase it passed on is the one the
waiter meant (the same ring position's arrival), and that the roles never all block.

The GEMM body is modelled in both MK_GEMM_OPERAND_FREE modes; the negative controls show that
the model catches the earlier bug (consumers freeing operand pages while the storer waits with
the ring generation's parity, removed 2026-11-29) and a storer that skips operand pages whose
`done` the consumers still complete.

The loads land asynchronously (a fourth role, the TMA engine, completes them in any order), and
every page a consumer reads must hold its own ring position's data: that is what the `full`
barriers are for. Both MK_GEMM_STAGE_FULL modes are modelled ("page": a `full` wait per operand
page; "stage": the A page's barrier takes the whole stage's bytes, the B pages' own `full` get a
plain arrival), with the early-weights order too (a GEMM's first B pages loaded before its A
pages, their bytes expected on an A barrier not yet armed); the negative control: a consumer
that waits on the A page alone while the B loads complete on their own barriers reads stale B
pages.

Every barrier also keeps the PTX ISA's rule ("Phases of the mbarrier object"): each completed
phase is observed by a successful wait before the next arrival on the barrier (compute-sanitizer
synccheck's "Missing wait", which stops the kernel). Under "stage" nobody else waits on a B
page's own `full`, so one consumer waits on the phase the loader's plain arrival completed,
before its own arrival frees the stage (gk.b_phases_seen, session 35; session 32's loader waited
itself, lost and removed); the negative control: without that wait the model reports the
loader's next arrival on the page.

Ping-pong (designed in session 54, measured and dropped in session 55: a one-warpgroup tile
without any epilogue ran slower than the cooperative tile with it, bench/GEMM_NOTES.md; the
model of its baton stays as the record of what such a schedule needs): with consumers=2 the two
consumer warpgroups are two roles; on the cooperative instructions each waits every barrier
itself and a consumer-side phase completes with both halves' arrivals (the kernel's count of
256: Barrier's arrival weights). A "ppgemm" tile belongs to one warpgroup, the owners
alternating; the other advances its page count past the tile and waits the owner's baton (pp[me],
arrived once the owner observed every `full` phase of the tile), since after the skip its parity
waits could pass on a phase two generations old. late_loads holds the epilogue pages' loads back
until nothing else can move: the window a baton given before the epilogue pages' waits opens.

The storer's two warps (storers=2; warp 2 is storer thread 0's) walk every instruction
together, each waiting `done` itself with its own parity bits, and meet in BAR_STORER at its
end. A page they read is freed by every storer thread after its own reads; a page they only
wait on (a GEMM's operand pages, in the kernel also K/V and hand-off pages) by each warp after
its own wait (rk.WAITED_FREE "all", session 54). Each warp's wait must precede its free: the
page's next use, and so its next `done` phase, then waits for both warps' waits. With warp 2
freeing alone ("lead", sessions 1-53) a warp 3 that falls behind the loader and consumers by a
ring meets the next use's phase before its wait on this one: the parity is back where it was,
and it blocks (a hang: warp 2 waits for it in BAR_STORER, the loader for its frees) or passes
on the phase two uses on. The negative control shows both, from random speeds alone too, and
with the instruction ring's slots (islots) bounding how far the loader runs ahead: BAR_STORER
and the slots bound the lag by instructions, and one instruction's pages can span the ring.

A rows body (copy, resadd) is warpgroup 0's with consumers=2 and rows_free set (the kernel's
shape; left unset, both warpgroups run it alike): warpgroup 1 walks its pages' `full` phases in
ring order (rk.rows_skip). Under "all" (rk.WAITED_FREE, session 54) it gives half of each page's
release (copy: `done`; resadd: the source page's `empty`, the sum page's `done`) after its own
wait, so the page's next use waits for it: that holds. Under "lead" (sessions 1-53) warpgroup 0
gives the whole count: a warpgroup 1 held back meets the next use's `full` phase first and hangs
or passes on the phase two uses on, the storer warps' failure again.

(Session 24's MK_GEMM_EPI_EARLY, the epilogue pages granted R stages before a tile's end, was
modelled here too; it lost on the GPU and was removed from the kernel and the model in session
28.)
"""

from __future__ import annotations

import random
import re

import pytest

NP = 13


class Violation(AssertionError):
    pass


class Barrier:
    """One mbarrier: the ring positions whose arrival completed each phase, in order (the model
    arrives once per hand-off: a role's arrivals for one use complete one phase together). With
    a transaction count (`full`): a phase completes once its arrival came and the bytes it
    expects (here: loads, one unit each) all landed; a load may land before the arrival that
    expects it (the count goes below zero, as the hardware's may within a phase)."""

    def __init__(self, name, phase_rule=True):
        self.name = name
        self.phase_rule = phase_rule    # the PTX rule below checked (the module docstring)
        self.sources = []
        self.arrived = None     # the ring position of this phase's arrival, once it came
        self.tx = 0
        self.seen = 0           # completed phases observed by a successful wait
        self.weight = 0         # this phase's arrivals so far; 2 completes it (a warpgroup's: 1)
        # phases completed, one count shared by a Ring's barriers: run()'s progress check reads
        # it each step (summing every barrier's phases took 70% of the run time)
        self.tally = [0]

    def arrive(self, pos, expect=0, weight=2):
        if self.phase_rule and self.seen < len(self.sources):
            raise Violation(f"{self.name}: Missing wait: ring position {pos} arrives after the "
                            f"phase of ring position {self.sources[-1]} completed unobserved")
        if self.weight and self.arrived != pos:
            raise Violation(f"{self.name}: ring positions {self.arrived} and {pos} arrive in "
                            f"one phase")
        self.arrived = pos
        self.weight += weight
        self.tx += expect
        self._complete()

    def expect(self, n):
        self.tx += n

    def complete_tx(self, n=1):
        self.tx -= n
        self._complete()

    def _complete(self):
        if self.weight >= 2 and self.tx == 0:
            self.sources.append(self.arrived)
            self.tally[0] += 1
            self.arrived = None
            self.weight = 0

    def try_wait(self, parity):
        return (len(self.sources) & 1) != parity


def gemm(kt, spp, epi, split=False):
    return ("gemm", kt, spp, 0 if split else epi)


def pp_gemm(kt, spp, epi, split=False):
    """A ping-pong GEMM tile: one consumer warpgroup's (the owners alternate); the loader and
    the storer take it as a gemm."""
    return ("ppgemm", kt, spp, 0 if split else epi)


GEMMS = ("gemm", "ppgemm")


def rows_copy(n):
    return ("copy", n)


def residual_add(n):
    return ("resadd", n)


class Ring:
    def __init__(self, operand_free="consumer", done_parity="mask", skip_operand_done=False,
                 stage_full="page", b_on_own_full=False, chain_pages=0, b_phase_seen="consumer",
                 phase_rule=True, consumers=1, baton="strict", late_loads=False, storers=1,
                 storer_free="warps", storer_lag=False, islots=None, rows_free=None,
                 rows_lag=False):
        self.full = [Barrier(f"full{p}", phase_rule) for p in range(NP)]
        self.done = [Barrier(f"done{p}", phase_rule) for p in range(NP)]
        self.empty = [Barrier(f"empty{p}", phase_rule) for p in range(NP)]
        self.operand_free = operand_free
        # 2: the consumer warpgroups as two roles (ping-pong; the module docstring)
        self.consumers = consumers
        # where a ppgemm tile's owner hands the other warpgroup the baton: "strict" (every
        # `full` phase of the tile observed, its epilogue pages' too), "mainloop" (the stages'
        # only: a negative control); negative controls: None (no baton), "never" (the owner
        # never arrives: run()'s deadlock detection)
        self.baton = baton
        self.pp = [Barrier(f"pp{w}", phase_rule) for w in range(2)] if consumers == 2 else []
        # 2: the storer's two warps as two roles (the module docstring), meeting in BAR_STORER
        # (a phase per instruction, both warps' arrivals complete it) at each instruction's end
        self.storers = storers
        # who frees a page the storer warps only wait on (rk.WAITED_FREE "all"): "warps" (each warp
        # after its own wait, half the count), "lead" (warp 2 alone after its own wait: the
        # negative control)
        self.storer_free = storer_free
        # warp 3 descheduled at each `done` wait until the page's next use has completed `done`
        # (or nothing else can move): the widest window a free before its wait can open
        self.storer_lag = storer_lag
        self.bar_storer = [Barrier("bar_storer", False)] if storers == 2 else []
        # the ring position each storer warp last waited `done` for (the negative control's
        # check of what warp 3 was waiting on)
        self.storer_at = [None, None]
        # consumers=2: who runs a rows body (copy, resadd) and releases its pages
        # (rk.WAITED_FREE): None, both warpgroups alike with half the count each (the model
        # before session 54, not the kernel's shape); "all", warpgroup 0 the body with half
        # the count, warpgroup 1 walking the pages' `full` phases (rk.rows_skip) and giving the
        # other half after its own wait on each; "lead" (the negative control), warpgroup 0
        # the whole count, warpgroup 1 waiting only
        self.rows_free = rows_free
        # warpgroup 1 descheduled at each rows_skip wait as storer_lag's warp 3 is
        self.rows_lag = rows_lag
        self.rows_at = None     # the ring position of warpgroup 1's last rows_skip wait
        bars = self.full + self.done + self.empty + self.pp + self.bar_storer
        self.tally = [0]
        for b in bars:
            b.tally = self.tally
        self.arrivals = lambda: self.tally[0]
        # the instruction ring's slots (MK_NISLOTS; None: no bound, the model before session
        # 54): the loader starts instruction i once every consumer and storer role has released
        # instruction i - islots' slot (the controller refills it then)
        self.islots = islots
        self.fin = {(r, w): 0 for r, n in (("c", consumers), ("s", storers))
                    for w in ([None] if n == 1 else range(n))}
        self.done_parity = done_parity
        # negative control: the consumers free operand pages and still arrive `done` on them,
        # while the storer skips them (its next wait may then be two phases behind)
        self.skip_operand_done = skip_operand_done
        self.stage_full = stage_full
        # negative control: "stage" waits with the B loads completing on their own barriers
        self.b_on_own_full = b_on_own_full
        # gk.chain_pages: the consumers wait for, stage and hand over the epilogue pages
        # chain_pages at a time (a tile whose page count it divides; 0: all at once)
        self.chain_pages = chain_pages
        # who observes the B pages' own `full` phases under "stage" (a plain arrival completes
        # them): "consumer" (gk.b_phases_seen: a consumer once the stage's A page passed, before
        # its arrival frees the stage; session 32's loader-side wait lost, removed in session
        # 63); None: the negative control, the kernel before session 32; "consumer_late" (a
        # negative control): the consumer's waits after its arrival that frees the stage
        self.b_phase_seen = b_phase_seen
        self.contents = [None] * NP     # the ring position whose load landed last in each page
        self.in_flight = []             # loads issued, not landed: (page, position, barrier)
        # the epilogue pages' (residual) loads land only when nothing else can move (run():
        # every role blocked, no other load in flight): a residual tile missing in L2 while the
        # later operand loads hit, a window the uniform order seldom opens
        self.late_loads = late_loads
        self.late = set()               # the ring positions of those loads
        self.stuck = False              # run(): every role blocked

    def layout(self, kt, spp, epi):
        """(s_epi, stage_pos): the stage before which the epilogue pages sit (kt: after the
        last) and each stage's ring offset in the tile."""
        return kt, (lambda k: k * spp)

    # ------------------------------------------------------------------------- waits
    def wait(self, bar, parity, want):
        """Generator step: block until the parity wait passes, then check that the phase it
        passed on was completed by ring position `want` (None: no phase completed yet is the
        right state, the page's first use)."""
        while not bar.try_wait(parity):
            yield bar.name
        self.seen(bar, want, "wait")

    @staticmethod
    def seen(bar, want, what):
        """A passed wait or test (`what`) observes the barrier's completed phases; the phase it
        passed on must be ring position want's."""
        bar.seen = len(bar.sources)
        got = bar.sources[-1] if bar.sources else None
        if got != want:
            raise Violation(f"{bar.name}: the {what} passed on the arrival of ring position {got}, "
                            f"meant {want}")

    # ------------------------------------------------------------------------- roles
    def wait_empty(self, q):
        yield from self.wait(self.empty[q % NP], ((q // NP) & 1) ^ 1, q - NP if q >= NP else None)

    def load(self, q, bar, late=False):
        """Issue the TMA load of ring position q's data, landing on barrier `bar` (late: an
        epilogue page's)."""
        self.in_flight.append((q % NP, q, bar))
        if late and self.late_loads:
            self.late.add(q)

    def tma(self, rng):
        """The TMA engine: lands the loads in flight in any order (late_loads: the epilogue
        pages' only when nothing else can move)."""
        while True:
            if not self.in_flight:
                yield "idle"
                continue
            if self.late:
                pick = [i for i, f in enumerate(self.in_flight) if f[1] not in self.late]
                if not pick and not self.stuck:
                    yield "held"
                    continue
                i = rng.choice(pick or range(len(self.in_flight)))
            else:
                i = rng.randrange(len(self.in_flight))
            p, q, bar = self.in_flight.pop(i)
            self.contents[p] = q
            bar.complete_tx()
            yield "landed"

    def finish(self, role, n):
        """Role (the key of fin) has released the slots of its first n instructions."""
        if self.islots:
            self.fin[role] = n
            self.tally[0] += 1      # progress: the loader may wait for it

    def loader(self, prog, rng):
        pg = 0
        for i, ins in enumerate(prog):
            while self.islots and min(self.fin.values()) <= i - self.islots:
                yield "islot"
            if ins[0] not in GEMMS:
                for _ in range(pages_of(ins)):
                    yield from self.wait_empty(pg)
                    self.full[pg % NP].arrive(pg, expect=1)
                    self.load(pg, self.full[pg % NP])
                    pg += 1
                continue
            _, kt, spp, epi = ins
            one = self.stage_full == "stage" and not self.b_on_own_full

            def b_pages(a):
                """A stage's B pages: each waits free, its load lands on the stage's barrier
                ("stage") or its own, whose phase it then completes (a plain arrival) or
                arms."""
                for j in range(1, spp):
                    q = a + j
                    yield from self.wait_empty(q)
                    if one:
                        self.load(q, self.full[a % NP])
                        self.full[q % NP].arrive(q)
                    else:
                        self.full[q % NP].arrive(q, expect=1)
                        self.load(q, self.full[q % NP])

            s_epi, pos = self.layout(kt, spp, epi)

            def grant_epilogue():
                """The epilogue pages: a residual load each, or a plain grant."""
                for e in range(epi):
                    q = pg + s_epi * spp + e
                    yield from self.wait_empty(q)
                    self.full[q % NP].arrive(q, expect=1)
                    self.load(q, self.full[q % NP], late=True)

            # early weights: the first stages' B pages before their A pages (A pages taken and
            # waited free in ring order, their barrier armed after the instruction's `ready`),
            # never past the epilogue pages (gemm_load caps them there)
            early = rng.choice((0, min(kt, NP // spp, s_epi)))
            for k in range(early):
                a = pg + pos(k)
                yield from self.wait_empty(a)
                if one:
                    self.full[a % NP].expect(spp - 1)
                yield from b_pages(a)
            yield "ready"
            for k in range(early):
                a = pg + pos(k)
                self.full[a % NP].arrive(a, expect=1)
                self.load(a, self.full[a % NP])
            for k in range(early, kt):
                if k == s_epi:
                    yield from grant_epilogue()
                a = pg + pos(k)
                yield from self.wait_empty(a)
                self.full[a % NP].arrive(a, expect=1 + (spp - 1 if one else 0))
                self.load(a, self.full[a % NP])
                yield from b_pages(a)
            if s_epi == kt:
                yield from grant_epilogue()
            pg += kt * spp + epi

    def read(self, q):
        """A consumer reads ring position q's page: it must hold q's data."""
        if self.contents[q % NP] != q:
            raise Violation(f"page {q % NP} read for ring position {q} holds "
                            f"{self.contents[q % NP]}'s data")

    def consumer(self, prog, wg=None):
        """The consumers: wg None, both warpgroups as one role; 0 / 1, one warpgroup of two
        (consumers=2), whose arrivals on the cooperative instructions weigh half."""
        pg = 0
        npp = 0     # ppgemm tiles so far: both warpgroups count them alike, the owner alternates
        half = 2 if wg is None else 1
        for i, ins in enumerate(prog):
            self.finish(("c", wg), i)
            if ins[0] == "ppgemm" and wg is not None:
                if npp & 1 == wg:
                    # the owner's 128 threads arrive twice (count 256), its thread 0 is ctid 0's
                    gives = self.baton in ("strict", "mainloop")
                    baton = (self.pp[wg ^ 1], npp) if gives else None
                    yield from self.consume_gemm(pg, ins, 2, True, baton)
                elif self.baton is not None:
                    # the other's tiles this one skipped before: the baton's phases so far
                    yield from self.wait(self.pp[wg], (npp >> 1) & 1, npp)
                pg += pages_of(ins)
                npp += 1
            elif ins[0] in GEMMS:
                # gk.b_phases_seen's thread is ctid 0: in warpgroup 0
                yield from self.consume_gemm(pg, ins, half, wg != 1)
                pg += pages_of(ins)
            elif self.rows_free and wg is not None:
                yield from (self.rows_skip if wg else self.rows_body)(pg, ins)
                pg += pages_of(ins)
            elif ins[0] == "copy":
                for _ in range(ins[1]):
                    yield from self.wait(self.full[pg % NP], (pg // NP) & 1, pg)
                    self.read(pg)
                    self.done[pg % NP].arrive(pg, weight=half)
                    pg += 1
            else:   # RESIDUAL_ADD: src page pa freed by the consumers, the sum in place in pb
                for _ in range(ins[1]):
                    pa, pb = pg, pg + 1
                    yield from self.wait(self.full[pa % NP], (pa // NP) & 1, pa)
                    yield from self.wait(self.full[pb % NP], (pb // NP) & 1, pb)
                    self.empty[pa % NP].arrive(pa, weight=half)
                    self.done[pb % NP].arrive(pb, weight=half)
                    pg += 2
        self.finish(("c", wg), len(prog))

    def rows_body(self, pg, ins):
        """rk.rows_consume in warpgroup 0 (rows_free): its waits, reads and releases."""
        w = 1 if self.rows_free == "all" else 2
        if ins[0] == "copy":
            for q in range(pg, pg + ins[1]):
                yield from self.wait(self.full[q % NP], (q // NP) & 1, q)
                self.read(q)
                self.done[q % NP].arrive(q, weight=w)
            return
        for pa in range(pg, pg + 2 * ins[1], 2):
            pb = pa + 1
            yield from self.wait(self.full[pa % NP], (pa // NP) & 1, pa)
            yield from self.wait(self.full[pb % NP], (pb // NP) & 1, pb)
            # not "group" mode: the storer's reads of pb's previous use
            yield from self.wait(self.empty[pb % NP], ((pb // NP) & 1) ^ 1,
                                 pb - NP if pb >= NP else None)
            self.read(pa)
            self.read(pb)
            self.empty[pa % NP].arrive(pa, weight=w)
            self.done[pb % NP].arrive(pb, weight=w)

    def rows_skip(self, pg, ins):
        """rk.rows_skip in warpgroup 1 (rows_free): every page's `full` phase waited in ring
        order; under "all" each wait followed by the warpgroup's half of the page's release
        (resadd: `empty` of a pair's source page, `done` of its sum page)."""
        for q in range(pg, pg + pages_of(ins)):
            self.rows_at = q
            if self.rows_lag:
                yield from self.held(self.full[q % NP], q)
            yield from self.wait(self.full[q % NP], (q // NP) & 1, q)
            if self.rows_free == "all":
                src = ins[0] == "resadd" and (q - pg) % 2 == 0
                (self.empty if src else self.done)[q % NP].arrive(q, weight=1)

    def consume_gemm(self, pg, ins, w, seer, baton=None):
        """One GEMM tile's consumer part from ring position pg: w, the weight of this role's
        arrivals; seer, whether it waits the B pages' own `full` (gk.b_phases_seen); baton, a
        ppgemm owner's (barrier, tile) to arrive on once the tile's `full` phases are seen."""
        _, kt, spp, epi = ins
        s_epi, pos = self.layout(kt, spp, epi)
        for k in range(kt):
            for j in range(1 if self.stage_full == "stage" else spp):
                q = pg + pos(k) + j
                yield from self.wait(self.full[q % NP], (q // NP) & 1, q)
            for j in range(spp):
                self.read(pg + pos(k) + j)
            if k > 0:
                self.release_stage(pg + pos(k - 1), spp, False, w)
                if self.b_phase_seen == "consumer_late" and seer:
                    yield "released"        # the loader may run in between
                    yield from self.b_phases_seen(pg + pos(k - 1), spp)
            if self.b_phase_seen == "consumer" and seer:
                yield from self.b_phases_seen(pg + pos(k), spp)
            yield "wgmma"
        self.release_stage(pg + pos(kt - 1), spp, True, w)
        if self.b_phase_seen == "consumer_late" and seer:
            yield "released"
            yield from self.b_phases_seen(pg + pos(kt - 1), spp)
        if baton and (self.baton == "mainloop" or epi == 0):
            baton[0].arrive(baton[1])
            baton = None
        ep = pg + s_epi * spp
        cp = self.chain_pages if ins[0] == "gemm" else 0    # "W" waits the whole epilogue
        step = cp if cp and epi % cp == 0 else max(epi, 1)
        for c0 in range(0, epi, step):
            for e in range(c0, c0 + step):
                q = ep + e
                yield from self.wait(self.full[q % NP], (q // NP) & 1, q)
                yield from self.wait(self.empty[q % NP], ((q // NP) & 1) ^ 1,
                                     q - NP if q >= NP else None)
            if baton and self.baton == "strict":
                baton[0].arrive(baton[1])
                baton = None
            yield "epilogue"
            for e in range(c0, c0 + step):
                self.read(ep + e)       # a residual tile's own rows
                self.done[(ep + e) % NP].arrive(ep + e, weight=w)

    def b_phases_seen(self, a, spp):
        """gk.b_phases_seen: the consumer's waits on the `full` of the B pages of the stage at
        ring position a (under "stage"; complete since the stage's A-page barrier passed)."""
        if self.stage_full != "stage":
            return
        for j in range(1, spp):
            q = a + j
            bar = self.full[q % NP]
            yield from self.wait(bar, (q // NP) & 1, q)

    def release_stage(self, q0, spp, last, w=2):
        for j in range(spp):
            q = q0 + j
            if self.operand_free == "consumer" and not last:
                self.empty[q % NP].arrive(q, weight=w)
                if self.skip_operand_done:
                    self.done[q % NP].arrive(q, weight=w)
            else:
                self.done[q % NP].arrive(q, weight=w)

    def storer(self, prog, w=None):
        """The storer: w None, both warps as one role; 0 / 1, warp 2 / warp 3 of two
        (storers=2), each with its own parity bits, meeting in BAR_STORER after every
        instruction."""
        pg = 0
        dpar = 0        # rk.wait_done's bits ("mask"); "ring": the page's generation instead
        for i, ins in enumerate(prog):
            self.finish(("s", w), i)
            # (pages, read): the pages waited for before their free; read False: waited only
            if ins[0] in GEMMS:
                _, kt, spp, epi = ins
                s_epi, pos = self.layout(kt, spp, epi)
                k0 = kt - 1 if self.operand_free == "consumer" else 0
                waited = [([pg + pos(k) + j], False) for k in range(k0, kt) for j in range(spp)]
                # the epilogue pages: with chain_pages a chain's all waited for, then stored and
                # freed (the TMA stores' read wait), before the next chain's
                cp = self.chain_pages if ins[0] == "gemm" else 0    # "W": no chains
                step = cp if cp and epi % cp == 0 else 1
                waited += [([pg + s_epi * spp + e for e in range(c0, c0 + step)], True)
                           for c0 in range(0, epi, step)]
                pg += kt * spp + epi
            elif ins[0] == "copy":
                waited = [([q], True) for q in range(pg, pg + ins[1])]
                pg += ins[1]
            else:
                waited = [([pg + 2 * r + 1], True) for r in range(ins[1])]
                pg += 2 * ins[1]
            for group, read in waited:
                for q in group:
                    p = q % NP
                    parity = (dpar >> p) & 1 if self.done_parity == "mask" else (q // NP) & 1
                    if w is not None:
                        self.storer_at[w] = q
                    if w == 1 and self.storer_lag:
                        yield from self.held(self.done[p], q)
                    yield from self.wait(self.done[p], parity, q)
                    dpar ^= 1 << p
                    yield "store"
                # a page read is freed by every storer thread after its own reads ("thread"
                # hand-off), a page only waited on as rk.WAITED_FREE says
                wt = 2 if w is None else 1 if read or self.storer_free == "warps" else 2 - 2 * w
                for q in group:
                    if wt:
                        self.empty[q % NP].arrive(q, weight=wt)
            if w is not None:
                self.bar_storer[0].arrive(i, weight=1)
                yield from self.wait(self.bar_storer[0], i & 1, i)
        self.finish(("s", w), len(prog))

    def held(self, bar, q):
        """storer_lag / rows_lag: warp 3 / warpgroup 1, due to wait on ring position q's phase of
        bar, descheduled until a later use of the page completed a phase of bar, or until nothing
        else can move (run() then sets stuck)."""
        while not (bar.sources and bar.sources[-1] > q) and not self.stuck:
            yield "held"
        self.stuck = False


def pages_of(ins) -> int:
    if ins[0] in GEMMS:
        return ins[1] * ins[2] + ins[3]
    if ins[0] == "copy":
        return ins[1]
    return 2 * ins[1]


def run(ring: Ring, prog, rng: random.Random, max_steps: int = 1_000_000):
    """Interleave the three roles (more: two consumer warpgroups, two storer warps) at random;
    raise Violation on a wrong pass or a deadlock (every unfinished role waiting, and no phase
    completed since each of them last tried: a half arrival lets no wait pass). A storer warp
    held back (storer_lag) goes on once nothing else can move: held, it is no deadlock."""
    roles = {"loader": ring.loader(prog, rng)}
    if ring.consumers == 2:
        roles.update(wg0=ring.consumer(prog, 0), wg1=ring.consumer(prog, 1))
    else:
        roles["consumer"] = ring.consumer(prog)
    if ring.storers == 2:
        roles.update(st0=ring.storer(prog, 0), st1=ring.storer(prog, 1))
    else:
        roles["storer"] = ring.storer(prog)
    tma = ring.tma(rng)     # runs until the others end (it never does)
    waiting = {}            # role -> (barrier name, arrivals when it last tried)
    # each schedule gives the roles their own speeds (a storer busy with stores falls behind)
    speed = {r: rng.choice((1, 4, 16)) for r in roles}
    if ring.storers == 2 and rng.random() < 0.5:
        speed[rng.choice(("st0", "st1"))] = 0.05     # a warp seldom scheduled
    if ring.rows_free and rng.random() < 0.5:       # (only then: the other tests keep streams)
        speed[rng.choice(("wg0", "wg1"))] = 0.05
    for _ in range(max_steps):
        live = list(roles)
        if not live:
            return
        now = ring.arrivals()
        stuck = ((ring.late_loads or not ring.in_flight)
                 and all(r in waiting and waiting[r][1] == now for r in live))
        held = [r for r in live if stuck and waiting[r][0] == "held"]
        if not ring.in_flight and stuck and not held:
            raise Violation(f"deadlock: {dict((r, w[0]) for r, w in waiting.items())}")
        if ring.in_flight and (ring.late_loads and stuck or rng.random() < 0.3):
            ring.stuck = stuck
            next(tma)
            continue
        if held:
            ring.stuck = True       # ring.held(): nothing else can move, the warp goes on
            name = held[0]
        else:
            name = rng.choices(live, weights=[speed[r] for r in live])[0]
        try:
            what = next(roles[name])
        except StopIteration:
            del roles[name]
            waiting.pop(name, None)
            continue
        if what.startswith(("full", "done", "empty", "pp", "bar", "held", "islot")):
            waiting[name] = (what, ring.arrivals())
        else:
            waiting.pop(name, None)
    raise Violation("no end within the step limit")


def random_prog(rng: random.Random, n: int = 40, pp: float = 0.0):
    """n random instructions; pp: the share of the GEMM tiles that are ppgemm (0 draws nothing
    more from rng, so the one-consumer tests keep their streams)."""
    prog = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.6:
            spp = rng.choice((2, 3))
            make = pp_gemm if pp and rng.random() < pp else gemm
            prog.append(make(rng.randint(1, 12), spp, rng.choice((1, 2, 4)),
                             split=rng.random() < 0.25))
        elif kind < 0.8:
            prog.append(rows_copy(rng.randint(1, 6)))
        else:
            prog.append(residual_add(rng.randint(1, 5)))
    return prog


@pytest.mark.parametrize("stage_full", ["stage", "page"])
@pytest.mark.parametrize("operand_free", ["storer", "consumer"])
def test_protocol_holds_under_random_interleavings(operand_free, stage_full):
    """Both GEMM operand-free modes and both `full` modes, with the storer's per-page done
    parity: every wait passes on the phase its own ring position completed, every page read
    holds its own position's data, and every schedule ends."""
    for seed in range(150):
        rng = random.Random(seed)
        run(Ring(operand_free=operand_free, done_parity="mask", stage_full=stage_full),
            random_prog(rng), rng)


@pytest.mark.parametrize("chain_pages", [1, 2])
def test_protocol_holds_with_the_epilogue_handed_over_by_chain(chain_pages):
    """gk.chain_pages: the consumers wait for, stage and hand over a tile's epilogue
    pages one output chain at a time (two of a 128 x 256 bf16 tile's four pages; 1: page by
    page), while the storer takes them in ring order: every wait passes on its own phase, every
    read holds its own position's data, every schedule ends."""
    for seed in range(120):
        rng = random.Random(seed)
        run(Ring(operand_free="consumer", done_parity="mask", stage_full="stage",
                 chain_pages=chain_pages), random_prog(rng), rng)


def _holds(ring_kw, seeds=150) -> list:
    """Runs `seeds` random streams under Ring(**ring_kw) (a violation fails the test); returns
    the rings."""
    rings = []
    for seed in range(seeds):
        rng = random.Random(seed)
        rings.append(Ring(**ring_kw))
        run(rings[-1], random_prog(rng), rng)
    return rings


def _violations(ring_kw, seeds=200) -> list[str]:
    """The violations of `seeds` random streams under Ring(**ring_kw), one message each."""
    out = []
    for seed in range(seeds):
        rng = random.Random(seed)
        prog = random_prog(rng)
        try:
            run(Ring(**ring_kw), prog, rng)
        except Violation as e:
            out.append(str(e))
    return out


def _fails(ring_kw, seeds=200):
    return len(_violations(ring_kw, seeds))


def test_model_catches_ring_parity_with_consumer_freed_pages():
    """Negative control: the removed MK_GEMM_CONSUMER_FREE (the storer waiting `done` with the
    ring generation's parity while operand pages complete no `done` phase) passes stale phases
    or deadlocks under the model."""
    assert _fails(dict(operand_free="consumer", done_parity="ring")) > 0


def test_model_catches_a_storer_two_phases_behind():
    """Negative control: consumers completing `done` on pages the storer skips (so done[p] can
    run ahead of the storer's count) fail under the model too."""
    assert _fails(dict(operand_free="consumer", done_parity="mask", skip_operand_done=True)) > 0


def test_model_catches_ring_parity_with_a_consumer_freed_src_page():
    """Negative control: RESIDUAL_ADD's src page completes no `done` phase, so the rows storer
    too needs the per-page parity: with the ring generation's it fails under the model."""
    assert _fails(dict(operand_free="storer", done_parity="ring")) > 0


def test_model_catches_a_stage_wait_without_the_b_bytes():
    """Negative control: consumers waiting on the A page's `full` alone while the B loads
    complete on the B pages' own barriers (the stage barrier not expecting their bytes) read B
    pages whose loads have not landed: stale data, not a deadlock. (The PTX phase rule is off
    here: it would report the B pages' unobserved phases first.)"""
    bad = _violations(dict(operand_free="consumer", done_parity="mask", stage_full="stage",
                           b_on_own_full=True, phase_rule=False))
    assert bad and all("holds" in m for m in bad), bad[:3]


def test_model_catches_b_phases_seen_after_the_stage_is_freed():
    """Negative control of gk.b_phases_seen's order: the consumer's waits on a stage's B pages'
    `full` after its own arrival that frees the stage (not before) let the loader arrive on a
    B page's `full` again before its previous phase was observed: "Missing wait"."""
    bad = _violations(dict(operand_free="consumer", done_parity="mask", stage_full="stage",
                           b_phase_seen="consumer_late"), seeds=60)
    assert bad and all("Missing wait" in m and m.startswith("full") for m in bad), bad[:3]


def test_model_catches_an_unobserved_b_page_phase():
    """Negative control: under "stage" without the loader's wait on the B pages' own `full`
    (the kernel before session 32) the B page's phase completes unobserved, and the next arrival
    on that page's `full` breaks the PTX rule: synccheck's "Missing wait", which the H200 showed
    on the loader's arrivals (bench/results/synccheck_default_2026-12-04_s32.log)."""
    bad = _violations(dict(operand_free="consumer", done_parity="mask", stage_full="stage",
                           b_phase_seen=None), seeds=60)
    assert bad and all("Missing wait" in m and m.startswith("full") for m in bad), bad[:3]


def _pp_holds(ring_kw, seeds, pp=0.6):
    """_holds for two consumer warpgroups, a share pp of the GEMM tiles ppgemm; the odd seeds
    hold the epilogue pages' loads back (late_loads), the window a late baton opens."""
    for seed in range(seeds):
        rng = random.Random(seed)
        run(Ring(consumers=2, late_loads=seed % 2 == 1, **ring_kw), random_prog(rng, pp=pp), rng)


def _pp_violations(ring_kw, seeds=100) -> list[str]:
    out = []
    for seed in range(seeds):
        rng = random.Random(seed)
        prog = random_prog(rng, pp=0.6)
        try:
            run(Ring(consumers=2, **ring_kw), prog, rng)
        except Violation as e:
            out.append(str(e))
    return out


def _generations_behind(msg) -> bool:
    """Whether msg is a wait that passed on its own page's phase an even number of generations
    before the one meant (None: before the page's first use): what a parity wait cannot tell."""
    g = re.fullmatch(r"full\d+: the wait passed on the arrival of ring position (\w+), "
                     r"meant (\d+)", msg)
    if not g:
        return False
    got, want = g.group(1), int(g.group(2))
    behind = want // NP - (-1 if got == "None" else int(got) // NP)
    return behind > 0 and behind % 2 == 0 and (got == "None" or int(got) % NP == want % NP)


@pytest.mark.parametrize("stage_full", ["stage", "page"])
def test_pingpong_baton_holds_under_random_interleavings(stage_full):
    """The ping-pong design of bench/GEMM_NOTES.md session 54: ppgemm tiles (splits too) owned
    by the two consumer warpgroups in turn, among cooperative GEMMs, copies and residual adds;
    the non-owner skips the tile's pages and waits the owner's baton, arrived once the owner
    observed every `full` phase of the tile (its epilogue pages' too). Every schedule ends,
    every wait (the baton's too) passes on its own phase, every read holds its own data, the
    PTX phase rule holds at every arrival, half arrivals included; also with the epilogue
    pages' loads landing last (late_loads)."""
    _pp_holds(dict(operand_free="consumer", done_parity="mask", stage_full=stage_full,
                   baton="strict"), 150)


def test_two_warpgroups_without_pingpong_hold():
    """The two consumer warpgroups as two roles on cooperative instructions only (bench/
    GEMM_NOTES.md session 54): each waits every barrier itself, and a consumer-side phase
    completes with both halves' arrivals (count 256), the stragglers' arrivals racing the
    other roles: every wait passes on its own phase, every schedule ends."""
    for stage_full in ("stage", "page"):
        _pp_holds(dict(operand_free="consumer", done_parity="mask", stage_full=stage_full),
                  50, pp=0)


def test_model_catches_pingpong_without_a_baton():
    """Negative control of session 54's baton (bench/GEMM_NOTES.md): a warpgroup that skips
    the other's tile and goes straight on waits on pages whose previous use (in the skipped
    tile, or two laps back) has not completed its `full` phase, and the parity wait passes on
    the phase an even number of generations old: the u / u - 2 problem, not a deadlock or a
    missed wait."""
    bad = _pp_violations(dict(operand_free="consumer", stage_full="stage", baton=None))
    assert bad and all(_generations_behind(m) for m in bad), bad[:3]


def test_model_catches_a_baton_after_the_mainloop():
    """Negative control (bench/GEMM_NOTES.md session 54): the baton arrived after the owner's
    mainloop, before its epilogue pages' waits. The loader has granted those pages then (it is
    in order) but a residual tile's load may still be in flight: the skipping warpgroup reaches
    the page's next use (13 positions on) and passes on the phase two generations back. With
    the uniform TMA order that window seldom opens (none of 150 streams failed); late_loads (the
    residual loads land only when nothing else can move) opens it in nearly every stream. (Not
    modelled, the model's epilogue pages all take a load: a plain grant's phase completes at the
    grant, which the in-order loader makes before any later page's, so this baton would hold
    for tiles without a residual; not for O_PROJ / DOWN (RESIDUAL), the ping-pong candidates.)"""
    bad = _pp_violations(dict(operand_free="consumer", stage_full="page", baton="mainloop",
                              late_loads=True), seeds=40)
    assert len(bad) > 30 and all(_generations_behind(m) for m in bad), bad[:3]


def test_model_catches_a_baton_never_passed():
    """Negative control of run()'s deadlock detection with four roles: an owner that never
    arrives on the baton leaves both warpgroups waiting on it and the loader and storer on the
    pages behind them."""
    bad = _pp_violations(dict(operand_free="consumer", stage_full="stage", baton="never"), 20)
    assert len(bad) == 20 and all(m.startswith("deadlock") and "pp" in m for m in bad), bad[:3]


def _lagged_runs(ring_kw, seeds, lag_kw, n=20, pp=0.0, lag=None):
    """Runs `seeds` random streams of n instructions under Ring(**ring_kw) with the hold-back
    option lag_kw (storer_lag: warp 3; rows_lag: warpgroup 1) on the odd seeds (lag None) or
    as lag says; returns (the violations' messages, the rings that raised them)."""
    out = []
    for seed in range(seeds):
        rng = random.Random(seed)
        prog = random_prog(rng, n=n, pp=pp)
        ring = Ring(**{lag_kw: seed % 2 == 1 if lag is None else lag}, **ring_kw)
        try:
            run(ring, prog, rng)
        except Violation as e:
            out.append((str(e), ring))
    return out


def _storer_runs(ring_kw, seeds, n=20, pp=0.0, lag=None):
    """_lagged_runs with the storer as two warps, warp 3 the one held back."""
    return _lagged_runs(dict(storers=2, **ring_kw), seeds, "storer_lag", n, pp, lag)


@pytest.mark.parametrize("operand_free", ["storer", "consumer"])
def test_two_storer_warps_hold_when_each_frees_after_its_own_wait(operand_free):
    """MK_WAITED_FREE=all (session 54): the storer as its two warps, each waiting `done` with
    its own parity bits and freeing a page it only waits on with half the count after its own
    wait, meeting in BAR_STORER after every instruction; each with its own speed (now and then
    one seldom scheduled), warp 3 on the odd seeds held back at each wait until nothing else can
    move. Under "storer" a GEMM's kt * spp operand pages (up to 36) are all waited on only, runs
    longer than the 13-page ring. Every schedule ends, every wait passes on its own phase, the
    PTX phase rule holds; with two consumer warpgroups (ping-pong tiles among them) too. (No
    instruction-slot bound here: islots only takes schedules away.)"""
    kw = dict(operand_free=operand_free, stage_full="stage", storer_free="warps")
    bad = _storer_runs(kw, 20)
    bad += _storer_runs(dict(consumers=2, **kw), 8, pp=0.5)
    assert not bad, [m for m, _ in bad[:3]]


def _a_use_behind(msg, ring) -> bool:
    """Whether msg is warp 3 (st1) a whole use of its page behind: its `done` wait passed on a
    phase of the page's use two or more laps on, or a deadlock with warp 3 waiting on a `done`
    whose page's next use completed a phase already, warp 2 waiting for it in BAR_STORER."""
    g = re.fullmatch(r"done(\d+): the wait passed on the arrival of ring position (\d+), "
                     r"meant (\d+)", msg)
    if g:
        p, got, want = (int(x) for x in g.groups())
        return ring.storer_at[1] == want and got % NP == p == want % NP and got >= want + 2 * NP
    want = ring.storer_at[1]
    return (msg.startswith("deadlock: ") and "'st0': 'bar_storer'" in msg
            and f"'st1': 'done{want % NP}'" in msg
            and ring.done[want % NP].sources[-1] >= want + NP)


@pytest.mark.parametrize("operand_free", ["storer", "consumer"])
def test_model_catches_a_storer_warp_a_ring_behind(operand_free):
    """Negative control of MK_WAITED_FREE=lead (sessions 1-53): warp 2 alone frees a page the
    storer only waits on, right after its own wait. Warp 3, held back at its waits until the
    page's next use has completed `done` (a descheduled warp), finds the parity back where it
    was: it blocks (a hang: warp 2 waits in BAR_STORER, the loader for frees behind warp 3) or,
    under "storer", passes on the phase two uses on. Every stream fails so, with the instruction
    ring's tightest build too (MK_NISLOTS=2: the loader at most one instruction ahead of the
    storer): nothing in the protocol bounds warp 3's lag below a ring. BAR_STORER meets once an
    instruction, a "storer" GEMM's waited-only run alone exceeds the ring, and under "consumer"
    the next instruction's pages (a GEMM's, the loader and consumers going on while warp 2
    waits in BAR_STORER) reach the page's next use. Random speeds alone (one warp scheduled up
    to 16 times as often as the other, or seldom) fail some streams too, the kernel's 4 slots."""
    kw = dict(operand_free=operand_free, stage_full="stage", storer_free="lead")
    bad = _storer_runs(dict(islots=2, **kw), 20, n=40, lag=True)
    assert len(bad) == 20 and all(_a_use_behind(m, r) for m, r in bad), [m for m, _ in bad[:3]]
    if operand_free == "storer":
        assert any(m.startswith("done") for m, _ in bad), [m for m, _ in bad[:3]]
    bad = _storer_runs(dict(islots=4, **kw), 20, n=40, lag=False)
    assert bad and all(_a_use_behind(m, r) for m, r in bad), [m for m, _ in bad[:3]]


def _rows_runs(ring_kw, seeds, n=40, pp=0.0, lag=None):
    """_lagged_runs with two consumer warpgroups and rows bodies as rows_free says, warpgroup 1
    the one held back."""
    return _lagged_runs(dict(consumers=2, **ring_kw), seeds, "rows_lag", n, pp, lag)


def test_rows_bodies_hold_when_the_idle_warpgroup_gives_half():
    """MK_WAITED_FREE=all (session 54): warpgroup 0 runs a copy's / residual add's body and
    gives half of each page's release, warpgroup 1 walks the same pages' `full` phases
    (rk.rows_skip) and gives the other half after its own wait on each; among cooperative and
    ping-pong GEMMs, both operand-free and both `full` modes, each warpgroup with its own speed
    (now and then one seldom scheduled), warpgroup 1 on the odd seeds held back at each
    rows_skip wait until nothing else can move; with the storer as two warps (their frees after
    their own waits) and the instruction slots too. Every schedule ends, every wait passes on
    its own phase, every read holds its own data, the PTX phase rule holds."""
    bad = []
    for i, (of, sf) in enumerate((("consumer", "stage"), ("storer", "page"))):
        bad += _rows_runs(dict(operand_free=of, stage_full=sf, rows_free="all"), 10, pp=0.3)
        bad += _rows_runs(dict(operand_free=of, stage_full=sf, rows_free="all", storers=2,
                               storer_free="warps", islots=(None, 4)[i]), 6, n=20, pp=0.3)
    assert not bad, [m for m, _ in bad[:3]]


def _wg1_a_use_behind(msg, ring) -> bool:
    """Whether msg is warpgroup 1 a whole use of its page behind in rows_skip: its `full` wait
    passed on the phase of the page's use two or more laps on, or a deadlock with it waiting on
    a `full` whose page's next use completed a phase already."""
    want = ring.rows_at
    g = re.fullmatch(r"full(\d+): the wait passed on the arrival of ring position (\d+), "
                     r"meant (\d+)", msg)
    if g:
        p, got, meant = (int(x) for x in g.groups())
        return meant == want and got % NP == p == want % NP and got >= want + 2 * NP
    return (msg.startswith("deadlock: ") and f"'wg1': 'full{want % NP}'" in msg
            and ring.full[want % NP].sources[-1] >= want + NP)


def test_model_catches_an_idle_warpgroup_a_ring_behind():
    """Negative control of MK_WAITED_FREE=lead (sessions 1-53): warpgroup 0 releases a rows
    body's pages for both warpgroups, warpgroup 1 only waits on them. Held back at its waits
    until the page's next use has completed `full` (a descheduled warpgroup), it finds the
    parity back where it was: it blocks (a hang once a cooperative instruction, or the
    instruction slots, wait for it) or, after a run of rows bodies, passes on the phase two uses
    on. Every stream fails so, with MK_NISLOTS=2 too; random speeds alone fail some streams
    with the kernel's 4 slots."""
    kw = dict(operand_free="consumer", stage_full="stage", rows_free="lead")
    bad = _rows_runs(dict(islots=4, **kw), 48, lag=True)
    assert len(bad) == 48 and all(_wg1_a_use_behind(m, r) for m, r in bad), \
        [m for m, _ in bad[:3]]
    assert any(m.startswith("full") for m, _ in bad), [m for m, _ in bad[:3]]
    bad = _rows_runs(dict(islots=2, **kw), 10, lag=True)
    assert len(bad) == 10 and all(_wg1_a_use_behind(m, r) for m, r in bad), \
        [m for m, _ in bad[:3]]
    bad = _rows_runs(dict(islots=4, **kw), 12, lag=False)
    assert bad and all(_wg1_a_use_behind(m, r) for m, r in bad), [m for m, _ in bad[:3]]
