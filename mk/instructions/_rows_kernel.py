"""CuTe DSL device bodies of the rows family (NOOP, COPY, RESIDUAL_ADD, RMSNORM) for mk.megakernel.

GPU path only: this module imports cutlass at the top, so its name starts with "_" and the opcode
registry (mk.instructions.base._load_all) never imports it. The torch faces stay in rows.py.

Page geometry (one page of the megakernel's shared-memory pool = 16 KiB):
    a page holds a *chunk* of PR=8 token rows x PC=1024 columns (bf16) of one activation buffer,
    stored as NBOX=4 consecutive TMA boxes of 8 rows x 256 columns (row-major, 512 B per box row).
Per instruction the chunks are walked row group by row group (PR rows), and inside a row group
column chunk by column chunk (PC columns). Every role (loader, consumer, storer) walks the same
sequence, so each computes the same page numbers from a running page count `pg`:
    page = pg % NPAGES, phase = (pg // NPAGES) & 1.
    COPY:          1 page per chunk (src), stored from the same page.
    RESIDUAL_ADD:  2 pages per chunk (src, then dst); the sum is written in place into the dst page
                   and stored; the src page is freed by the consumer right after its last read.
    RMSNORM:       1 page per instruction, with no data in it (rmsnorm_consume): the consumers
                   read the rows from global memory and write the normalized rows back
                   themselves; the page only orders those stores before the storer's signal.
Roles and their arrivals on the page barriers:
    full[p]   loader arrive_and_expect_tx (count 1) + TMA bytes
    done[p]   consumer warpgroup once the page holds the result to store (not for RESIDUAL_ADD's
              src page, which nobody waits on: done[p] completes a phase only for the page uses
              the storer waits on, whose parity the storer counts itself, see wait_done)
    empty[p]  storer warps after the stores read the page; for RESIDUAL_ADD's src page the
              consumer warpgroup, as soon as it has read it
Loads are TMA (cp.async.bulk.tensor, async proxy); stores are 16-byte st.global by the storer warps
with exact row/column masks (a TMA store would write whole boxes, clobbering neighbours' rows).

Generic-proxy hand-offs (HANDOFF modes). A page (or an instruction-ring slot) written with plain
st.shared by one role and read with ld.shared by another is handed over by an mbarrier. By the PTX
memory model an mbarrier.arrive releases only the *arriving thread's* prior accesses; the other
threads' accesses reach it through a bar.sync / __syncwarp first. compute-sanitizer racecheck does
not follow that transitive path (bench/probes/racecheck_mbarrier_probe.py shows which patterns it
models), so the kernel hands off in one of three compile-time modes:
    "thread"  every accessing thread arrives itself (CUTLASS PipelineAsync with
              CooperativeGroup(Agent.Thread, n)): no bar.sync on the hand-off path
    "warp"    each warp runs __syncwarp, then its lane 0 arrives (arrival count = warps)
    "group"   the role's threads meet in a named barrier, then one thread arrives (the original
              protocol: correct, cheapest in arrivals, but racecheck reports every hand-off)
Every barrier's init count is the sum of its arriving roles' shares (`arrivals`); a role with fewer
threads than the share arrives with a count > 1 (the storer's share of empty[p]). In the "thread"
and "warp" modes the consumer also waits on empty[p] (already complete: the loader waited on it)
before writing a page in place, which makes the storer-read -> consumer-write order of the page's
previous use direct instead of running through the loader's TMA.
"""

from __future__ import annotations

import os

import cutlass
import cutlass.cute as cute
import cutlass.experimental.primitives as prims
from cutlass import BFloat16, Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from mk import tiles
from mk.instructions import _common as mc
from mk.instructions.base import Buf
from mk.ir import Op

PR = 8                 # token rows per page
BOXC = 256             # columns per TMA box (the TMA box limit)
NBOX = 4               # boxes per page
PC = BOXC * NBOX       # columns per page (1024)
PAGE = 16384           # bytes per page
BOX_BYTES = PR * BOXC * 2
ROW_BYTES = BOXC * 2   # bytes per box row
assert NBOX * BOX_BYTES == PAGE

OP_NOOP = int(Op.NOOP)
OP_COPY = int(Op.COPY)
OP_RMSNORM = int(Op.RMSNORM)
OP_RESIDUAL_ADD = int(Op.RESIDUAL_ADD)
# an RMSNORM into this destination is a row-scale RMSNORM (mk/instructions/rows.py; norm fold)
BUF_ROW_SCALE = int(Buf.ROW_SCALE)

# error kinds written to the megakernel's error record (see mk.megakernel)
ERR_COUNTER_WAIT = 1
ERR_PAGE_EMPTY = 2
ERR_PAGE_FULL = 3
ERR_PAGE_DONE = 4
ERR_INSTR_SLOT = 5
ERR_BAD_OPCODE = 6
ERR_INSTR_READY = 8     # (7 is the megakernel's ERR_BAD_META)
ERR_INSTR_STALLED = 9   # MK_WAIT_WATCHDOG: the controller's bounded wait for a slot's roles


HANDOFF_MODES = ("thread", "warp", "group")


def arrivals(mode: str, nthreads: int) -> int:
    """Arrivals a role of nthreads threads makes on an mbarrier per hand-off in `mode`."""
    assert mode in HANDOFF_MODES, mode
    return nthreads if mode == "thread" else (nthreads // 32 if mode == "warp" else 1)


@cute.jit
def release(bar: cute.Pointer, share: cutlass.Constexpr, nthreads: cutlass.Constexpr, gtid: Int32,
            bar_id: cutlass.Constexpr, mode: cutlass.Constexpr, sync: cutlass.Constexpr = True):
    """Hand the prior shared-memory accesses of a role (nthreads threads, gtid 0..nthreads-1) to
    the waiters of mbarrier `bar`; the role contributes `share` arrivals in all (see HANDOFF)."""
    if cutlass.const_expr(mode == "thread"):
        cute.arch.mbarrier_arrive(bar, arrive_count=share // nthreads)
    elif cutlass.const_expr(mode == "warp"):
        if cutlass.const_expr(sync):
            cute.arch.sync_warp()
        if gtid % 32 == 0:
            cute.arch.mbarrier_arrive(bar, arrive_count=share // (nthreads // 32))
    else:
        if cutlass.const_expr(sync):
            if cutlass.const_expr(nthreads == 32):
                cute.arch.sync_warp()
            else:
                cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthreads)
        if gtid == 0:
            cute.arch.mbarrier_arrive(bar, arrive_count=share)


@cute.jit
def ceil_div(a: Int32, b: cutlass.Constexpr) -> Int32:
    return (a + (b - 1)) // b


@cute.jit
def nbox_of(col: Int32, col_end: Int32) -> Int32:
    """Boxes of a chunk starting at column `col` that hold columns < col_end."""
    n = (col_end - col + (BOXC - 1)) // BOXC
    r = Int32(NBOX)
    if n < NBOX:
        r = n
    return r


@cute.jit
def abort_raised(state: cute.Tensor):
    """Whether a failed wait has raised the abort flag (one relaxed gpu-scope L2 read)."""
    return cute.arch.load((state.iterator + S_ABORT).llvm_ptr, Int32, sem="relaxed",
                          scope="gpu") != 0


@cute.jit
def abort_or_timeout(state: cute.Tensor, t0: Int64, timeout_ns: Int64) -> Int32:
    """A bounded wait's verdict while its condition still fails: 3 another wait has raised the
    abort flag, 2 more than timeout_ns since t0 (globaltimer), else 0 (keep waiting)."""
    st = Int32(0)
    if abort_raised(state):
        st = Int32(3)
    elif cute.arch.globaltimer() - t0 > timeout_ns:
        st = Int32(2)
    return st


@cute.jit
def bar_wait(bar: cute.Pointer, phase: Int32, timeout_ns: Int64, state: cute.Tensor,
             kind: cutlass.Constexpr, ticket: Int32):
    """mbarrier parity wait, bounded: on timeout write the error record (first error wins, raises
    the abort flag); also gives up at once when another wait has raised the abort flag, so one
    failure ends the kernel quickly instead of every later wait timing out in turn."""
    if cutlass.const_expr(kind in WAIT_SLIM_KINDS):
        unbounded_bar_wait(bar, phase)
    elif cutlass.const_expr(WATCHDOG):
        watchdog_role_wait(bar, phase, state, kind)
    elif cutlass.const_expr(WAIT_COMPACT):
        compact_bar_wait(bar, phase, timeout_ns, state, kind, ticket, True)
    elif not cute.arch.mbarrier_try_wait(bar, phase):
        t0 = cute.arch.globaltimer()
        st = Int32(0)
        if cutlass.const_expr(ABORT_POLL_AFTER_NS == 0):
            while st == 0:
                if cute.arch.mbarrier_try_wait(bar, phase):
                    st = Int32(1)
                else:
                    st = abort_or_timeout(state, t0, timeout_ns)
        else:
            while st == 0:
                if cute.arch.mbarrier_try_wait(bar, phase):
                    st = Int32(1)
                else:
                    waited = cute.arch.globaltimer() - t0
                    if waited > timeout_ns:
                        st = Int32(2)
                    elif waited > ABORT_POLL_AFTER_NS:
                        if abort_raised(state):
                            st = Int32(3)
        if st == 2:
            write_wait_error(state, kind, ticket, phase)


@cute.jit
def compact_bar_wait(bar: cute.Pointer, phase: Int32, timeout_ns: Int64, state: cute.Tensor,
                     kind: cutlass.Constexpr, ticket: Int32, abort_poll: cutlass.Constexpr):
    """bar_wait / bounded_bar_wait with MK_WAIT_COMPACT: the same deadline and abort poll in
    a loop with one live flag, the record written where the deadline passes (no verdict
    variable carried out of the loop for a switch after it: ptxas made that a jump table at
    every wait)."""
    if not cute.arch.mbarrier_try_wait(bar, phase):
        t0 = cute.arch.globaltimer()
        live = Int32(1)
        while live != 0:
            if cute.arch.mbarrier_try_wait(bar, phase):
                live = Int32(0)
            else:
                live = wait_verdict(state, kind, ticket, phase, t0, timeout_ns, abort_poll)


@cute.jit
def watched_bar_wait(bar: cute.Pointer, phase: Int32, state: cute.Tensor):
    """try_wait until the phase completes or the abort flag is up, read after every failed
    try_wait, each of which may suspend the thread WATCHED_HINT_NS (the watchdog's role page
    waits); no clock, no deadline, no record."""
    if not cute.arch.mbarrier_try_wait(bar, phase):
        live = Int32(1)
        while live != 0:
            if try_wait_suspend(bar, phase, WATCHED_HINT_NS):
                live = Int32(0)
            elif abort_raised(state):
                live = Int32(0)


@cute.jit
def watchdog_role_wait(bar: cute.Pointer, phase: Int32, state: cute.Tensor,
                       kind: cutlass.Constexpr):
    """A role's mbarrier wait under MK_WAIT_WATCHDOG: a page wait ends when its phase completes
    or the abort flag is up (watched_bar_wait); an instruction-slot wait (the roles' wait
    for the controller's fill or `iready`) has neither bound nor abort exit, since the controller,
    bounded in all its waits, fills every slot it claims and ends with END, also after an error
    (an exit on abort would run the slot's stale words)."""
    if cutlass.const_expr(kind in (ERR_INSTR_SLOT, ERR_INSTR_READY)):
        unbounded_bar_wait(bar, phase)
    else:
        watched_bar_wait(bar, phase, state)


@cute.jit
def watchdog_slot_wait(bar: cute.Pointer, phase: Int32, timeout_ns: Int64, state: cute.Tensor,
                       ticket: Int32):
    """The controller's wait (MK_WAIT_WATCHDOG) for ring slot `bar`'s roles to be done with
    instruction `ticket`: bounded; past the deadline the record (ERR_INSTR_STALLED, the ticket)
    and the abort flag, which ends the roles' page waits, then a second bounded wait while they
    drain the slot (the record of the first stands), so that the controller refills no slot
    that its roles still read."""
    compact_bar_wait(bar, phase, timeout_ns, state, ERR_INSTR_STALLED, ticket, False)
    compact_bar_wait(bar, phase, timeout_ns, state, ERR_INSTR_STALLED, ticket, False)


@dsl_user_op
def try_wait_suspend(bar: cute.Pointer, phase: Int32, hint_ns: cutlass.Constexpr, *, loc=None,
                     ip=None) -> cutlass.Boolean:
    """mbarrier.try_wait.parity with a suspend-time hint: the thread may sleep up to hint_ns
    (instead of the system's limit) unless the phase completes first."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(bar.toint()).ir_value(loc=loc, ip=ip),
                  Int32(phase).ir_value(loc=loc, ip=ip)],
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2, "
        f"{int(hint_ns)};\nselp.b32 $0, 1, 0, p;\n}}", "=r,r,r,~{memory}",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip)) != 0


@cute.jit
def wait_verdict(state: cute.Tensor, kind: cutlass.Constexpr, ticket: Int32, phase: Int32,
                 t0: Int64, timeout_ns: Int64, abort_poll: cutlass.Constexpr) -> Int32:
    """compact_bar_wait after a failed poll: 0 (stop waiting) past the deadline, with the
    record written, or (abort_poll) once the abort flag is up, read past ABORT_POLL_AFTER_NS;
    else 1."""
    live = Int32(1)
    waited = cute.arch.globaltimer() - t0
    if waited > timeout_ns:
        write_wait_error(state, kind, ticket, phase)
        live = Int32(0)
    elif cutlass.const_expr(abort_poll):
        if waited > ABORT_POLL_AFTER_NS:
            if abort_raised(state):
                live = Int32(0)
    return live


# MK_WAIT_SLIM=1 (a probe, never a default: its waits have no bound, so a megakernel bug hangs
# the GPU instead of naming the starved instruction): the mbarrier waits of bar_wait /
# bounded_bar_wait compile to a bare try_wait loop, without the deadline, the abort poll and the
# inline error record (bench/code_size.py: 26% of the step's SASS in the M1024 class). It asks
# whether that cold code, inline in every hot loop, costs the step's GEMM K steps their ~25%
# against a kernel with one GEMM slot (bench/GEMM_NOTES.md session 42).
WAIT_SLIM = os.environ.get("MK_WAIT_SLIM", "0") == "1"


def _slim_kinds() -> frozenset:
    """MK_WAIT_SLIM_KINDS: the ERR_* kinds whose mbarrier waits are unbounded (MK_WAIT_SLIM=1:
    all)."""
    raw = os.environ.get("MK_WAIT_SLIM_KINDS", "")
    bar_kinds = {ERR_PAGE_EMPTY, ERR_PAGE_FULL, ERR_PAGE_DONE, ERR_INSTR_SLOT, ERR_INSTR_READY}
    if WAIT_SLIM:
        return frozenset(bar_kinds)
    try:
        kinds = frozenset(int(k) for k in raw.split(",") if k.strip())
    except ValueError:
        kinds = frozenset({-1})
    if not kinds <= bar_kinds:
        raise ValueError(f"MK_WAIT_SLIM_KINDS={raw}: a comma list of mbarrier wait kinds "
                         f"{sorted(bar_kinds)} (ERR_* in mk/instructions/_rows_kernel.py)")
    return kinds


# MK_WAIT_SLIM_KINDS=k,... (a probe): only those kinds' waits unbounded, the others keep their
# bound and record. Session 51's slim build hangs in the mixed step's first launch where the
# bounded one runs and checks clean: slim some kinds, and a bounded wait that starves names
# the instruction.
WAIT_SLIM_KINDS = _slim_kinds()


@cute.jit
def unbounded_bar_wait(bar: cute.Pointer, phase: Int32):
    """mbarrier parity wait without a deadline or abort exit (MK_WAIT_SLIM's and
    MK_WAIT_SLIM_KINDS's probes; the roles' instruction-slot waits under MK_WAIT_WATCHDOG)."""
    done = Int32(0)
    while done == 0:
        if cute.arch.mbarrier_try_wait(bar, phase):
            done = Int32(1)


# Page waits read the abort word (one L2 line, polled by every waiting warp of every CTA) only
# once they have waited this long (ns); 0 = on every poll, as GPU-verified. A hand-off that
# completes while its waiter is in that L2 round trip is seen one round trip late. Compile-time,
# 2000 by default since its GPU check (bench/results/switches_2026-11-29.log).
ABORT_POLL_AFTER_NS = int(os.environ.get("MK_ABORT_POLL_AFTER_NS", "2000"))


def _power_of_two_knob(name: str) -> int:
    """A compile-time poll gate from the environment: 1 (unset) or a power of 2."""
    raw = os.environ.get(name, "1")
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name}={raw}: a power of 2 (1: every poll)")
    return value


# A poll gate, compile-time, 1 by default (the waits as before, the PTX byte-identical). Session
# 51's MK_WAIT_SLIM probe (unbounded mbarrier waits) took decode B=1 / 1024 3.0% / 1.8% off the
# step; session 52 asked which part of the bound costs it. (MK_WAIT_CHECK_EVERY=16, the clock,
# deadline and abort word on every 16th failed poll of every compact wait, slim's hot loop at the
# default's code size, was +0.6% / +1.0% at B=1 / 1024: removed; what slim saves is the code,
# which the watchdog below moves out of the roles. MK_ABORT_POLL_EVERY, MK_PAGE_ABORT_POLL and
# MK_WAIT_WATCHED, probes of the roles' page waits, went with the watchdog in session 53.)
# MK_COUNTER_CHECK_EVERY=N: a counter wait (wait_counter: the controller's dependency waits)
# reads the abort word and the clock on every N-th failed poll only. Each failed poll now pays
# a second L2 round trip (the abort word) after the counter's own, so a dependency that lands
# meanwhile is seen that much later; at B=1 the step is a chain of such hand-offs (~46k
# instructions in 9 ms). MK_WAIT_SLIM leaves these waits as they are.
COUNTER_CHECK_EVERY = _power_of_two_knob("MK_COUNTER_CHECK_EVERY")
# The watchdog's role page waits may suspend the thread this long (ns) per failed try_wait
# (MK_WAIT_HINT_NS; the phase's completion still wakes it at once).
WATCHED_HINT_NS = int(os.environ.get("MK_WAIT_HINT_NS", "20000"))
# The watchdog (MK_WAIT_WATCHDOG, compile-time; the default since session 53, 0 builds the waits
# of sessions 1-52): the bound moves from ~170 inline wait sites to the controller. Every role
# page wait is watched_bar_wait's hinted try_wait loop that ends on the abort flag, the roles'
# instruction-slot waits are bare (watchdog_role_wait); the controller's waits for a slot's roles
# (iempty before a refill, lnext, and after END each slot still holding an instruction) are
# bounded and their record names the ticket in that slot (ERR_INSTR_STALLED; watchdog_slot_wait).
# A role that stalls holds its slot, so the controller reaches that slot's wait within NISLOTS
# claims, or its counter waits (bounded as before) time out first. SASS of the M64 class -10.4%
# (slim -15.3%); session 53 on an H100 (bench/results/waitslim_*_cd120bc_*_s53_h100*): decode
# B=1 -2.3% / -2.0% (two calls), B=1024 -1.0%, the mixed step +0.4%; the megakernel and step GPU
# tests, the two-layer checks and racecheck clean with it (verify_watchdog_*_s53_h100.log).
# MK_WAIT_SLIM / MK_WAIT_SLIM_KINDS probe the waits of sessions 1-52 (their controller too), so
# they turn it off.
WATCHDOG = os.environ.get("MK_WAIT_WATCHDOG", "0" if WAIT_SLIM_KINDS else "1")
if WATCHDOG not in ("0", "1"):
    raise ValueError(f"MK_WAIT_WATCHDOG={WATCHDOG}: 0 or 1")
WATCHDOG = WATCHDOG == "1"
if WATCHDOG and WAIT_SLIM_KINDS:
    raise ValueError("MK_WAIT_WATCHDOG=1 and MK_WAIT_SLIM / MK_WAIT_SLIM_KINDS: one wait policy "
                     "at a time")


@cute.jit
def journal_put(journal: cute.Tensor, ticket: Int32, word: cutlass.Constexpr, value: Int64, me):
    """Thread `me` writes value into word `word` of the megakernel journal's row `ticket`, where
    the journal has that row."""
    if me:
        if ticket < journal.shape[0]:
            journal[ticket, word] = value


@cute.jit
def journal_stamp(journal: cute.Tensor, ticket: Int32, word: cutlass.Constexpr, me):
    """A body's time stamp in the megakernel's journal variant (as Megakernel.stamp): globaltimer
    into word `word` of row `ticket` (journal_put)."""
    if me:
        journal_put(journal, ticket, word, cute.arch.globaltimer(), me)


@cute.jit
def wait_clock_start(wclk):
    """The journal variant's wait clock (wclk: a 1-element Int32 register tensor, or None outside
    it): the time before a wait."""
    t0 = Int64(0)
    if cutlass.const_expr(wclk is not None):
        t0 = cute.arch.globaltimer()
    return t0


@cute.jit
def wait_clock_add(wclk, t0: Int64):
    """Add the time since t0 (wait_clock_start) to the wait clock."""
    if cutlass.const_expr(wclk is not None):
        wclk[0] = wclk[0] + Int32(cute.arch.globaltimer() - t0)


@cute.jit
def wait_clock_write(wclk, journal, ticket: Int32, word: cutlass.Constexpr, me):
    """The wait clock's total into word `word` of the journal row `ticket` (thread `me`)."""
    if cutlass.const_expr(wclk is not None):
        journal_put(journal, ticket, word, Int64(wclk[0]), me)


def make_wait_clock(word: int):
    """A wait clock (zeroed) when the journal variant asks for one (word >= 0), else None: the
    time a role spends in one kind of wait, summed over an instruction (ATTENTION's page and
    wgmma waits, GEMM's operand and wgmma waits; mk.trace reports them per opcode). 32-bit
    nanoseconds (an instruction's waits are far below 4 s): the attention consumers hold three
    of them through their block loop, and as 64-bit sums they spilled the journal variant once
    the pairs' block walk was in (session 15)."""
    if word < 0:
        return None
    wclk = cute.make_rmem_tensor(cute.make_layout(1), Int32)
    wclk[0] = Int32(0)
    return wclk


@cute.jit
def imin(a: Int32, b: Int32) -> Int32:
    r = a
    if b < a:
        r = b
    return r


@cute.jit
def udiv(a: Int32, b: Int32) -> Int32:
    """a // b for a >= 0, b > 0 (row / column splits of a flat index): unsigned, since a signed
    Int32 division needs sign fix-ups around the unsigned one."""
    return Int32(cutlass.Uint32(a) // cutlass.Uint32(b))


@cute.jit
def page_of(pg: Int32, npages: cutlass.Constexpr):
    """Ring count pg (>= 0) -> (page, parity). Unsigned, since a signed division by the constant
    npages needs a sign fix-up: fewer instructions at each of the many page waits."""
    upg = cutlass.Uint32(pg)
    return Int32(upg % npages), Int32((upg // npages) & 1)


@cute.jit
def ring_add(page: Int32, parity: Int32, d, npages: cutlass.Constexpr):
    """(page, parity) of the ring count d after one whose (page, parity) is given, for 0 <= d <
    npages: page_of(pg + d) from page_of(pg) with an add and a compare instead of a division (a
    cursor for loops that walk the ring a few pages at a time)."""
    page_d = page + d
    parity_d = parity
    if page_d >= npages:
        page_d = page_d - npages
        parity_d = parity_d ^ 1
    return page_d, parity_d


# The storer's parity of every page's done[p]. done[p] completes a phase only for the page uses
# the storer waits on (result and epilogue pages, a GEMM's last stage); a page the consumers free
# themselves (RESIDUAL_ADD's src page, a GEMM's operand pages under GEMM_OPERAND_FREE=consumer)
# completes none, so the parity of its next phase is not the ring generation's: the storer keeps
# one bit per page (dpar[0], an rmem word of the storer's threads; NP <= 32), flipped at each wait.
# Sound as the ring parity is: the next use of the page the storer waits on needs the loader's
# grant, which needs the storer's own free of this use (every later use of the page waits for the
# empty phase that free completes), so done[p] never runs two phases ahead of the storer, and
# its previous phase is one the storer waited on itself.
@cute.jit
def done_parity_init(dpar: cute.Tensor):
    dpar[0] = Int32(0)


@cute.jit
def wait_done(done: cute.Pointer, page: Int32, dpar: cute.Tensor, timeout_ns: Int64,
              state: cute.Tensor, ticket: Int32):
    """The storer's wait for the consumers' `done` on `page`, and its parity bit's flip."""
    bar_wait(done + page, (dpar[0] >> page) & 1, timeout_ns, state, ERR_PAGE_DONE, ticket)
    dpar[0] = dpar[0] ^ (Int32(1) << page)


# L2 eviction priorities of TMA loads: CUTLASS's CacheHintSm90 encodings of an L2 cache policy
# (the 64-bit operand of `cp.async.bulk.tensor ... .L2::cache_hint`)
L2_EVICT_NORMAL = 0x1000000000000000
L2_EVICT_FIRST = 0x12F0000000000000
L2_EVICT_LAST = 0x14F0000000000000
# Which streams' TMA loads carry an L2 hint (compile-time, MK_L2_HINTS, comma-separated; default
# "weights,kv" since session 11; "none" = no hint, as before):
#   weights  the GEMM weight (B) pages: evict first. A decode step streams ~17 GB of weights
#            through the 50 MB L2 once each, pushing out what is read again soon: activations,
#            split-K partials, counters, and the kernel's own code, which each SM fetches cold
#            for a body it runs once per layer (bench/E2E_NOTES.md sessions 7-8).
#   kv       the K/V pages of a decode unit (one query row per sequence: read once per step):
#            evict first; prefill units (their keys read by every query tile) keep the default.
#   acts     the GEMM activation (A) pages: evict last (not in the default; session 40, not yet
#            timed). In a large step each activation tile is read again by every column tile
#            of its rows (28-64 at B=4096), each weight tile by 8 row tiles of a raster run.
# H200, 70B TP8 rank, decode ctx 1024, same GPU and call (bench/results/l2hint_*_2026-11-30_s11):
# B=1 9.674 -> 8.530 ms (-11.8%), B=64 13.045 -> 11.959 (-8.3%), B=256 22.768 -> 22.223 (-2.4%);
# "weights" alone -11.8% / -2.2% / -0.3%. Every instruction got faster (B=1: ATTENTION 13.5 ->
# 9.5 us, ATTN_REDUCE 7.1 -> 4.9, QKV_ROPE 11.1 -> 9.4): their code and inputs now stay in L2.
_L2_HINTS_ENV = os.environ.get("MK_L2_HINTS", "weights,kv")
L2_HINTS = frozenset(t for t in _L2_HINTS_ENV.split(",") if t and t != "none")
assert L2_HINTS <= {"weights", "kv", "acts"}, f"unknown MK_L2_HINTS parts {set(L2_HINTS)}"


def activation_policy():
    """The L2 policy of GEMM activation loads: evict last under MK_L2_HINTS "acts", else None (no
    hint). Called while a body is traced."""
    return Int64(L2_EVICT_LAST) if "acts" in L2_HINTS else None


def weight_policy():
    """The L2 policy of GEMM weight loads (tma_box's policy): evict first under MK_L2_HINTS
    "weights", else None (no hint). Called while a body is traced."""
    return Int64(L2_EVICT_FIRST) if "weights" in L2_HINTS else None


@cute.jit
def tma_views(tma: cute.CopyAtom, g: cute.Tensor, s_layout: cute.ComposedLayout,
              box_rows: cutlass.Constexpr, pool: Int32, page: Int32, byte_off, row: Int32,
              col: Int32, z: Int32, dtype: cutlass.Constexpr = BFloat16):
    """The TMA partitions (smem, gmem) of one box of box_rows x 128 bytes (64 bf16 or 32 float32
    columns of `dtype`: one SW128 atom): page `page` of the pool at `byte_off`, element (row,
    col, z) of g (rows, cols, z)."""
    p = cute.make_ptr(dtype, pool + page * PAGE + byte_off, cute.AddressSpace.smem,
                      assumed_align=1024)
    p = cute.recast_ptr(p, s_layout.inner, dtype=dtype)
    s = cute.make_tensor(p, s_layout.outer)
    gt = cute.local_tile(cute.domain_offset((row, col, z), g),
                         (box_rows, 128 // (dtype.width // 8)), (0, 0, 0))
    return cute.nvgpu.cpasync.tma_partition(tma, 0, cute.make_layout(1), cute.group_modes(s, 0, 2),
                                            cute.group_modes(gt, 0, 2))


@cute.jit
def tma_store_box(tma: cute.CopyAtom, g: cute.Tensor, s_layout: cute.ComposedLayout,
                  box_rows: cutlass.Constexpr, pool: Int32, page: Int32, byte_off, row: Int32,
                  col: Int32, z: Int32, dtype: cutlass.Constexpr = BFloat16):
    """TMA-store one box (box_rows x 128 bytes of `dtype`, tma_views) from page `page` of the pool
    at `byte_off` to element (row, col, z) of g (tma: an S2G atom; the caller commits the bulk
    group and waits on it)."""
    ts, tg = tma_views(tma, g, s_layout, box_rows, pool, page, byte_off, row, col, z, dtype)
    cute.copy(tma, ts, tg)


@cute.jit
def tma_box(tma: cute.CopyAtom, g: cute.Tensor, s_layout: cute.ComposedLayout,
            box_rows: cutlass.Constexpr, pool: Int32, page: Int32, byte_off, row: Int32, col: Int32,
            z: Int32, bar: cute.Pointer, policy=None):
    """TMA one (box_rows x 64) bf16 box of g (rows, cols, z) at element (row, col, z) into page
    `page` of the pool at `byte_off`, completing on mbarrier `bar` (64 columns = one SW128 atom).
    policy: None (no hint) or an Int64 L2 cache policy (L2_EVICT_*)."""
    ts, tg = tma_views(tma, g, s_layout, box_rows, pool, page, byte_off, row, col, z)
    if cutlass.const_expr(policy is None):
        cute.copy(tma, tg, ts, tma_bar_ptr=bar)
    else:
        cute.copy(tma, tg, ts, tma_bar_ptr=bar, cache_policy=policy)


@cute.jit
def free_page(page: Int32, empty: cute.Pointer, sid: Int32, bar_id: cutlass.Constexpr,
              nthreads: cutlass.Constexpr, share: cutlass.Constexpr):
    """After the storer's generic reads of an epilogue page: hand it back to the loader (TMA).
    share a multiple of nthreads: every storer thread arrives after its own reads ("thread"
    hand-off); otherwise the threads meet in bar_id and thread 0 arrives with the whole share."""
    if cutlass.const_expr(share % nthreads == 0):
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.mbarrier_arrive(empty + page, arrive_count=share // nthreads)
    else:
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthreads)
        if sid == 0:
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.mbarrier_arrive(empty + page, arrive_count=share)


# Who frees a page that several warps wait on: every warp that waits on a use's phase must have
# observed it before the page's next use can begin, or its parity wait finds the parity back
# where it was (two phases: a parity wait cannot tell u from u - 2) and blocks until a third, a
# whole use behind on that page from then on (a wrong-phase pass or a hang; the model:
# tests/test_page_protocol.py, storers=2). MK_WAITED_FREE:
#   "all"   (the default since session 54) each waiting warp takes part in the free: a page the
#           storer warps only wait on (a K/V page, a GEMM's last operand stage, a consumer-stored
#           body's hand-off page) is freed by lane 0 of each storer warp after the warp's own
#           wait (sync_warp) with its part of the count; a rows body's pages (COPY /
#           RESIDUAL_ADD, warpgroup 0's) get half their count from warpgroup 1 after its
#           rows_skip wait on each.
#   "lead"  sessions 1-53: storer thread 0 alone frees after its own wait, warpgroup 0 arrives
#           for both warpgroups. Nothing bounds how far one storer warp runs ahead of the other
#           between their BAR_STORER meetings (a prefill ATTENTION walks hundreds of K/V pages
#           through the 13-page ring), nor warpgroup 1's rows_skip walk: soundness must not rest
#           on warps' speeds. Kept for A/B timing.
WAITED_FREE = os.environ.get("MK_WAITED_FREE", "all")
if WAITED_FREE not in ("all", "lead"):
    raise ValueError(f"MK_WAITED_FREE={WAITED_FREE!r}: all (the default) or lead")


@cute.jit
def free_waited_page(page: Int32, empty: cute.Pointer, sid: Int32, nthreads: cutlass.Constexpr,
                     share: cutlass.Constexpr):
    """The storer's free of a page it only waited `done` on (every storer thread waited on it
    with its own parity bit, wait_done): see WAITED_FREE."""
    if cutlass.const_expr(WAITED_FREE == "lead"):
        if sid == 0:
            cute.arch.mbarrier_arrive(empty + page, arrive_count=share)
    else:
        # each warp's lane 0 after the warp's own wait, with its part of the count
        release(empty + page, share, nthreads, sid, 0, "warp")


@cute.jit
def grant_page(pg: Int32, npages: cutlass.Constexpr, full: cute.Pointer, empty: cute.Pointer,
               timeout_ns: Int64, state: cute.Tensor, ticket: Int32) -> Int32:
    """Loader: hand the next ring page to the consumers with no TMA into it (an output page)."""
    page, ph = page_of(pg, npages)
    bar_wait(empty + page, ph ^ 1, timeout_ns, state, ERR_PAGE_EMPTY, ticket)
    if cutlass.const_expr(STARVE_TICKET >= 0):
        if ticket != STARVE_TICKET:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive(full + page)
    else:
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive(full + page)
    return pg + 1


# MK_TEST_STARVE_TICKET=N (tests only; -1, off, compiles nothing): the loader never hands
# instruction N's granted page over, so its consumers' page-full wait and its storer's page-done
# wait time out: the GPU test that an mbarrier wait's bound holds and its record (write_error's
# or MK_WAIT_COMPACT's) names the starved instruction (counter waits have their own test).
STARVE_TICKET = int(os.environ.get("MK_TEST_STARVE_TICKET", "-1"))


@cute.jit
def bounded_bar_wait(bar: cute.Pointer, phase: Int32, timeout_ns: Int64, state: cute.Tensor,
                     kind: cutlass.Constexpr, ticket: Int32):
    """mbarrier parity wait with a deadline; on timeout write an error record and raise abort.

    Intra-CTA waits only time out on a megakernel bug; the record names the barrier kind."""
    if cutlass.const_expr(kind in WAIT_SLIM_KINDS):
        unbounded_bar_wait(bar, phase)
    elif cutlass.const_expr(WATCHDOG):
        watchdog_role_wait(bar, phase, state, kind)
    elif cutlass.const_expr(WAIT_COMPACT):
        compact_bar_wait(bar, phase, timeout_ns, state, kind, ticket, False)
    elif not cute.arch.mbarrier_try_wait(bar, phase):
        t0 = cute.arch.globaltimer()
        st = Int32(0)
        while st == 0:
            if cute.arch.mbarrier_try_wait(bar, phase):
                st = Int32(1)
            elif cute.arch.globaltimer() - t0 > timeout_ns:
                st = Int32(2)
        if st == 2:
            write_wait_error(state, kind, ticket, phase)


# state words (an Int32 tensor of STATE_WORDS, see mk.megakernel)
S_HEAD = 0
S_EXIT = 1
S_ABORT = 2
S_ERR_FLAG = 4
S_ERR_KIND = 5
S_ERR_INSTR = 6
S_ERR_COUNTER = 7
S_ERR_VALUE = 8
S_ERR_TARGET = 9
S_ERR_SM = 10
S_ERR_CTA = 11
S_ERR_PACKED = 12       # words 12-13: an mbarrier wait's record with MK_WAIT_COMPACT (one 64-bit CAS)
STATE_WORDS = 16

# MK_WAIT_COMPACT (the default since session 44; =0 builds the old waits): an mbarrier wait that
# times out writes its record as one 64-bit CAS into S_ERR_PACKED (first wins;
# unpack_wait_error) and raises the abort flag, instead of write_error's CAS, seven stores and
# fence, inline at every wait of every body. The deadline and the abort poll stay: only the code
# is smaller (M1024 class -5.2k SASS instructions), and the step faster: decode B=64 / 256 / 1024
# -3.1% / -0.6..-1.5% / -1.4% (bench/GEMM_NOTES.md session 44).
WAIT_COMPACT = os.environ.get("MK_WAIT_COMPACT", "1") == "1"


def unpack_wait_error(packed: int) -> dict:
    """The fields of an S_ERR_PACKED record (write_wait_error's packing: ticket in bits 0-31,
    kind 32-39, the waited phase 40, SM 41-48, CTA 49-63), as write_error's words."""
    return dict(kind=(packed >> 32) & 0xFF, instr=packed & 0xFFFFFFFF, counter=-1, value=0,
                target=(packed >> 40) & 1, sm=(packed >> 41) & 0xFF, cta=(packed >> 49) & 0x7FFF)


@cute.jit
def wait_counter(counters: cute.Tensor, c: Int32, target: Int32, timeout_ns: Int64,
                 state: cute.Tensor, ticket: Int32, backoff_ns: cutlass.Constexpr) -> Int32:
    """Spin until counters[c] >= target (ld.acquire.gpu, nanosleep doubling from 20 ns up to
    backoff_ns, bounded by timeout_ns from globaltimer). 1 = ok. The controller's waits (mk.
    megakernel) and a folded GEMM tile's epilogue wait (the loader's, _gemm_kernel.gemm_load)."""
    p = (counters.iterator + c).llvm_ptr
    v = cute.arch.load(p, Int32, sem="acquire", scope="gpu")
    ok = Int32(1)
    if v < target:
        t0 = cute.arch.globaltimer()
        ns = Int32(20)
        st = Int32(0)
        polls = Int32(1)
        while st == 0:
            prims.nanosleep(ns)
            if ns < backoff_ns:
                ns = ns * 2
                if ns > backoff_ns:
                    ns = Int32(backoff_ns)
            v = cute.arch.load(p, Int32, sem="acquire", scope="gpu")
            if v >= target:
                st = Int32(1)
            elif cutlass.const_expr(COUNTER_CHECK_EVERY > 1):
                # polls counts the failed polls in steps of 2 (odd: never 0); the abort word
                # and the clock on every COUNTER_CHECK_EVERY-th of them only
                polls = polls + 2
                if (polls & (2 * COUNTER_CHECK_EVERY - 1)) == 1:
                    st = abort_or_timeout(state, t0, timeout_ns)
            else:
                st = abort_or_timeout(state, t0, timeout_ns)
        if st == 2:
            write_error(state, ERR_COUNTER_WAIT, ticket, c, v, target)
        if st != 1:
            ok = Int32(0)
    return ok


@cute.jit
def write_error(state: cute.Tensor, kind: cutlass.Constexpr, ticket: Int32, counter: Int32,
                value: Int32, target: Int32):
    """First error wins (CAS on the flag); every error raises the abort flag."""
    old = cute.arch.atomic_cas((state.iterator + S_ERR_FLAG).llvm_ptr, cmp=Int32(0), val=Int32(1),
                               sem="relaxed", scope="gpu")
    if old == 0:
        bidx, _, _ = cute.arch.block_idx()
        state[S_ERR_KIND] = Int32(kind)
        state[S_ERR_INSTR] = ticket
        state[S_ERR_COUNTER] = counter
        state[S_ERR_VALUE] = value
        state[S_ERR_TARGET] = target
        state[S_ERR_SM] = cute.arch.smid()
        state[S_ERR_CTA] = Int32(bidx)
    cute.arch.fence_acq_rel_gpu()
    cute.arch.atomic_exch((state.iterator + S_ABORT).llvm_ptr, Int32(1), sem="relaxed", scope="gpu")


@cute.jit
def write_wait_error(state: cute.Tensor, kind: cutlass.Constexpr, ticket: Int32, phase: Int32):
    """An mbarrier wait's timeout record: write_error's, or with MK_WAIT_COMPACT one 64-bit CAS
    of the packed fields (unpack_wait_error) and the abort flag."""
    if cutlass.const_expr(WAIT_COMPACT):
        bidx, _, _ = cute.arch.block_idx()
        hi = Int32(kind) | ((phase & 1) << 8) | (cute.arch.smid() << 9) | (Int32(bidx) << 17)
        packed = (Int64(hi) << 32) | (Int64(ticket) & Int64(0xFFFFFFFF))
        cute.arch.atomic_cas((state.iterator + S_ERR_PACKED).llvm_ptr, cmp=Int64(0), val=packed,
                             sem="relaxed", scope="gpu")
        cute.arch.atomic_exch((state.iterator + S_ABORT).llvm_ptr, Int32(1), sem="relaxed",
                              scope="gpu")
    else:
        write_error(state, kind, ticket, Int32(-1), Int32(0), phase)


# ------------------------------------------------------------------------------------ loader
@cute.jit
def load_chunk(tma: cute.CopyAtom, mT: cute.Tensor, buf: Int32, row: Int32, col: Int32,
               col_end: Int32, pool: Int32, full: cute.Pointer, empty: cute.Pointer, pg: Int32,
               npages: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor, ticket: Int32):
    """Warp-wide: wait for page pg to be empty, then TMA the chunk (rows row.., cols col..) in."""
    page = pg % npages
    phase = (pg // npages) & 1
    bounded_bar_wait(empty + page, phase ^ 1, timeout_ns, state, ERR_PAGE_EMPTY, ticket)
    nbox = nbox_of(col, col_end)
    with cute.arch.elect_one():
        cute.arch.mbarrier_arrive_and_expect_tx(full + page, nbox * BOX_BYTES)
    g2 = mT[None, None, buf]
    for b in cutlass.range_constexpr(NBOX):
        if b < nbox:
            gt = cute.local_tile(cute.domain_offset((row, col + b * BOXC), g2), (PR, BOXC), (0, 0))
            sp = cute.make_ptr(BFloat16, pool + page * PAGE + b * BOX_BYTES,
                               cute.AddressSpace.smem, assumed_align=128)
            st = cute.make_tensor(sp, cute.make_layout((PR, BOXC), stride=(BOXC, 1)))
            tas, tag = cute.nvgpu.cpasync.tma_partition(
                tma, 0, cute.make_layout(1), cute.group_modes(st, 0, 2), cute.group_modes(gt, 0, 2))
            cute.copy(tma, tag, tas, tma_bar_ptr=full + page)


@cute.jit
def rows_load(tma: cute.CopyAtom, mT: cute.Tensor, op: Int32, src: Int32, dst: Int32, row0: Int32,
              rows: Int32, col0: Int32, cols: Int32, pool: Int32, full: cute.Pointer,
              empty: cute.Pointer, pg: Int32, npages: cutlass.Constexpr, timeout_ns: Int64,
              state: cute.Tensor, ticket: Int32) -> Int32:
    """Loader warp body of COPY / RESIDUAL_ADD; returns the new page count."""
    # The rows were written by generic-proxy stores (other CTAs, made visible by the controller's
    # acquire); order them before this warp's async-proxy (TMA) reads.
    cute.arch.fence_proxy("async.global")
    nrg = ceil_div(rows, PR)
    ncc = ceil_div(cols, PC)
    col_end = col0 + cols
    for g in range(nrg):
        for cc in range(ncc):
            c = col0 + cc * PC
            load_chunk(tma, mT, src, row0 + g * PR, c, col_end, pool, full, empty, pg, npages,
                       timeout_ns, state, ticket)
            pg = pg + 1
            if op == OP_RESIDUAL_ADD:
                load_chunk(tma, mT, dst, row0 + g * PR, c, col_end, pool, full, empty, pg, npages,
                           timeout_ns, state, ticket)
                pg = pg + 1
    return pg


@cute.jit
def rows_pages(op: Int32, rows: Int32, cols: Int32) -> Int32:
    """Pages of the ring one COPY / RESIDUAL_ADD instruction uses (RMSNORM: one, granted)."""
    n = ceil_div(rows, PR) * ceil_div(cols, PC)
    if op == OP_RESIDUAL_ADD:
        n = n * 2
    return n


WG_THREADS = 128       # one consumer warpgroup


@cute.jit
def rows_skip(op: Int32, pg: Int32, npg: Int32, full: cute.Pointer, empty: cute.Pointer,
              done: cute.Pointer, npages: cutlass.Constexpr, lane: Int32, timeout_ns: Int64,
              state: cute.Tensor, ticket: Int32, share: cutlass.Constexpr):
    """The consumer warpgroup that does not run a rows body (warpgroup 1) still walks its pages'
    `full` phases in ring order: a parity wait cannot tell phase u from u - 2, so a waiter that
    skipped a page's use could pass a later wait on that page one generation early. Under
    WAITED_FREE "all" each of its warps then gives half the page's count (share: both
    warpgroups') to the barrier rows_consume releases it on (COPY: `done`; RESIDUAL_ADD: the
    source page's `empty`, the sum page's `done`), so the page's next use waits for this walk."""
    for q in range(pg, npg):
        page = q % npages
        bounded_bar_wait(full + page, (q // npages) & 1, timeout_ns, state, ERR_PAGE_FULL,
                         ticket)
        if cutlass.const_expr(WAITED_FREE == "all"):
            # each warp's lane 0 after the warp's own wait: half the count, over its 4 warps
            if op == OP_RESIDUAL_ADD and (q - pg) % 2 == 0:
                release(empty + page, share // 2, WG_THREADS, lane, 0, "warp")
            else:
                release(done + page, share // 2, WG_THREADS, lane, 0, "warp")


# ------------------------------------------------------------------------------------ consumer
@cute.jit
def smem_vec(addr: Int32):
    """8 bf16 (16 bytes) of shared memory at byte address addr."""
    return cute.make_tensor(cute.make_ptr(BFloat16, addr, cute.AddressSpace.smem, assumed_align=16),
                            cute.make_layout(8))


@cute.jit
def warp_allreduce_sum(x: Float32) -> Float32:
    for i in cutlass.range_constexpr(5):
        x = x + cute.arch.shuffle_sync_bfly(x, offset=1 << (4 - i))
    return x


@cute.jit
def norm_weight(normw: cute.Tensor, wrow: Int32, col: Int32):
    """8 norm weights (bf16) of table row wrow from column col (a multiple of 8)."""
    wp = cute.make_ptr(BFloat16, (normw.iterator + (wrow * normw.shape[1] + col)).toint(),
                       cute.AddressSpace.gmem, assumed_align=16)
    return cute.make_tensor(wp, cute.make_layout(8)).load()


@cute.jit
def rows_consume(op: Int32, rows: Int32, col0: Int32, cols: Int32, pool: Int32,
                 full: cute.Pointer, empty: cute.Pointer, done: cute.Pointer, pg: Int32,
                 npages: cutlass.Constexpr, ctid: Int32, bar_id: cutlass.Constexpr,
                 nthreads: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
                 ticket: Int32, mode: cutlass.Constexpr, share: cutlass.Constexpr) -> Int32:
    """Consumer warpgroup body of COPY / RESIDUAL_ADD (128 threads). Warp w owns rows 2w, 2w+1 of
    every page; lane l owns
    the 16-byte vectors at column l*8 of each of the 4 boxes (the same bytes in every op, so a
    consumer thread never races another consumer thread on a page).

    share: the done[p] / empty[p] init count (the megakernel's page_share: the barrier counts
    every consumer thread of both warpgroups in "thread" mode); this warpgroup arrives for half
    of it, rows_skip's warpgroup for the rest (WAITED_FREE; "lead": this one for all)."""
    cw = ctid // 32
    lane = ctid % 32
    ra = cw * 2
    # WAITED_FREE "all": warpgroup 1 gives the other half after its rows_skip wait
    share_here = share if cutlass.const_expr(WAITED_FREE == "lead") else share // 2
    nrg = ceil_div(rows, PR)
    ncc = ceil_div(cols, PC)
    col_end = col0 + cols
    if op == OP_COPY:
        for i in range(nrg * ncc):
            page = pg % npages
            phase = (pg // npages) & 1
            bounded_bar_wait(full + page, phase, timeout_ns, state, ERR_PAGE_FULL, ticket)
            if cutlass.const_expr(WAITED_FREE == "lead"):
                if ctid == 0:   # COPY: the consumer never touches the page, one arrival does
                    cute.arch.mbarrier_arrive(done + page, arrive_count=share)
            else:
                release(done + page, share // 2, nthreads, ctid, bar_id, mode)
            pg = pg + 1
    elif op == OP_RESIDUAL_ADD:
        for i in range(nrg * ncc):
            cc = i % ncc
            pa = pg % npages
            pha = (pg // npages) & 1
            pb = (pg + 1) % npages
            phb = ((pg + 1) // npages) & 1
            bounded_bar_wait(full + pa, pha, timeout_ns, state, ERR_PAGE_FULL, ticket)
            bounded_bar_wait(full + pb, phb, timeout_ns, state, ERR_PAGE_FULL, ticket)
            if cutlass.const_expr(mode != "group"):
                # the storer's reads of pb's previous use (complete already: the loader waited)
                bounded_bar_wait(empty + pb, phb ^ 1, timeout_ns, state, ERR_PAGE_EMPTY, ticket)
            nbox = nbox_of(col0 + cc * PC, col_end)
            for v in cutlass.range_constexpr(NBOX):
                if v < nbox:
                    for r in cutlass.range_constexpr(2):
                        off = v * BOX_BYTES + (ra + r) * ROW_BYTES + lane * 16
                        ta = smem_vec(pool + pa * PAGE + off)
                        tb = smem_vec(pool + pb * PAGE + off)
                        s = ta.load().to(Float32) + tb.load().to(Float32)
                        tb.store(s.to(BFloat16))
            # src page pa: last read done, free it now (no `done`: the storer never waits on
            # it, and done[p] completes phases only for the uses it waits on, see wait_done)
            release(empty + pa, share_here, nthreads, ctid, bar_id, mode)
            release(done + pb, share_here, nthreads, ctid, bar_id, mode, sync=False)
            pg = pg + 2
    return pg


# ------------------------------------------------------------------------------------ RMSNORM
# RMSNORM runs in the consumers alone: they read their rows straight from global memory, sum the
# squares across both warpgroups, and write the normalized rows back. The paged body it replaced
# (TMA into pages, two passes over the resident pages, the storer copying them out) took 17-23 us
# for one row on the H200, on the step's critical path twice per layer
# (bench/results/switches_2026-11-29_six-on.log); this one costs about one global round trip per
# row. One ring page is still taken, with no data in it (the loader grants it without a TMA): the
# consumers' `done` after their stores, then the storer's wait and signal, order those stores
# before the instruction's counter as a split-K tile's partial stores are.
NORM_VECS = 4          # 16-byte vectors per thread per row: H <= 256 threads * 8 * NORM_VECS
                       # (8, for H = 16384, spilled in the rows-only journal variant)
NORM_MAX_H = 256 * 8 * NORM_VECS
assert NORM_MAX_H == tiles.NORM_MAX_HIDDEN
# Rows whose loads are in flight together (one round trip, one named barrier per group of them):
# an 8-row RMSNORM that walked its rows one by one took ~20 us at B=1024 (a global round trip
# and a barrier per row while the GEMMs and attention load the memory system; bench/E2E_NOTES.md
# session 14). A group's missing rows (rows not a multiple of it) load the last row again and
# store nothing. MK_NORM_ROW_BATCH (1, 2, 4, 8) builds another group size for A/Bs; 1 is the
# row-by-row body of session 13.
NORM_ROW_BATCH = int(os.environ.get("MK_NORM_ROW_BATCH", 2))
if NORM_ROW_BATCH not in (1, 2, 4, 8):
    raise ValueError(f"MK_NORM_ROW_BATCH={NORM_ROW_BATCH}: 1, 2, 4 or 8 rows per group")
# ... in the megakernel variants of 128-row GEMM tiles (the M classes above 64, whose norms
# have 8 to 32 rows; MK_NORM_ROW_BATCH_BIG, default MK_NORM_ROW_BATCH): session 48's journal
# put B=4096's 32-row norm bodies (16 round trips of 2 rows) at 9.5% of its critical path; 4
# and 8 compile without spills there, while 8 spills 8 bytes in the M64 variant (norms of 1-2
# rows, where a bigger group only loads the last row again)
NORM_ROW_BATCH_BIG = int(os.environ.get("MK_NORM_ROW_BATCH_BIG", NORM_ROW_BATCH))
if NORM_ROW_BATCH_BIG not in (1, 2, 4, 8):
    raise ValueError(f"MK_NORM_ROW_BATCH_BIG={NORM_ROW_BATCH_BIG}: 1, 2, 4 or 8 rows per group")
NORM_WARPS = 8         # consumer warps of both warpgroups (rmsnorm_consume's nthreads // 32)


@cute.jit
def bf16x8(addr: Int64):
    """8 bf16 (16 bytes) of global memory at byte address addr."""
    return cute.make_tensor(cute.make_ptr(BFloat16, addr, cute.AddressSpace.gmem, assumed_align=16),
                            cute.make_layout(8))


@cute.jit
def f32x8(addr: Int64):
    """8 float32 (32 bytes, 16-byte aligned) of global memory at byte address addr."""
    return cute.make_tensor(cute.make_ptr(Float32, addr, cute.AddressSpace.gmem, assumed_align=16),
                            cute.make_layout(8))


@cute.jit
def row_scale_at(sk: cute.Tensor, tokens: Int32, row: Int32):
    """ROW_SCALE[row, 0] (float32; mk.instructions.base.Buf.ROW_SCALE) as a 1-element tensor. It
    is not a kernel parameter of its own but the last `tokens` floats of the SPLITK allocation sk
    (tokens: the arena's token rows T; mk.plan.splitk_shape pads SPLITK for them), so it adds no
    parameter to the variants with split-K."""
    addr = sk.iterator.toint() + (Int64(sk.shape[0]) * Int64(sk.shape[1]) - Int64(tokens)
                                  + Int64(row)) * 4
    return cute.make_tensor(cute.make_ptr(Float32, addr, cute.AddressSpace.gmem, assumed_align=4),
                            cute.make_layout(1))


@cute.jit
def row_part_addr(sk: cute.Tensor, tokens: Int32, ld: Int32) -> Int64:
    """Byte address of ROW_PART[0, 0] (float32 [tokens, ld], compact; mk.instructions.base.
    Buf.ROW_PART, PlanConfig.norm_fold=4): like ROW_SCALE not a kernel parameter but the end of
    the SPLITK allocation sk: the tokens * ld floats that end at the last 16-byte boundary
    before ROW_SCALE's last `tokens` floats (mc.row_part_offset). No division: this address is
    computed at every site that reads or writes ROW_PART."""
    numel = Int64(sk.shape[0]) * Int64(sk.shape[1])
    return sk.iterator.toint() + mc.row_part_offset(numel, Int64(tokens), Int64(ld)) * 4


@dsl_user_op
def pack_bf16x2(a: Float32, b: Float32, *, loc=None, ip=None) -> Int32:
    """(bf16(a), bf16(b)) in one 32-bit word, a in the low half (the lower address in memory):
    one packed round to nearest even (cvt.rn.bf16x2.f32, F2FP), where .to(BFloat16) costs a
    scalar conversion per element."""
    return Int32(llvm.inline_asm(
        T.i32(), [Float32(b).ir_value(loc=loc, ip=ip), Float32(a).ir_value(loc=loc, ip=ip)],
        "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", has_side_effects=False,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def opaque(x: Int32, *, loc=None, ip=None) -> Int32:
    """x through a volatile move: the compiler cannot hoist or merge what is derived from it.
    Loop-invariant shared-memory addresses (wgmma descriptors of a fixed operand) hoisted out of
    the consumers' instruction loop stay live across every other body there (spills)."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(x).ir_value(loc=loc, ip=ip)], "mov.b32 $0, $1;", "=r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc, ip=ip))


@dsl_user_op
def add_bf16x2(a: Int32, b: Int32, *, loc=None, ip=None) -> Int32:
    """The two bf16 sums of packed a and b, rounded once to nearest even (add.rn.bf16x2, HADD2):
    equal to the float32 sum rounded to bf16 (a float32 holds 24 bits, >= 2 x 8 + 2, so the two
    roundings of a bf16 + bf16 sum are innocuous), i.e. RESIDUAL's res + bf16(acc) in bf16, the
    HADD2 the compiler makes of residual_add where it sees bf16 operands."""
    return Int32(llvm.inline_asm(
        T.i32(), [Int32(a).ir_value(loc=loc, ip=ip), Int32(b).ir_value(loc=loc, ip=ip)],
        "add.rn.bf16x2 $0, $1, $2;", "=r,r,r", has_side_effects=False,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))


@dsl_user_op
def unpack_bf16x2(packed: Int32, *, loc=None, ip=None):
    """The two bf16 halves of a 32-bit word widened to float32, low half first (exact: a shift
    and a mask)."""
    lo = packed << 16
    hi = packed & Int32(-65536)        # 0xffff0000
    return (Float32(llvm.bitcast(T.f32(), lo.ir_value(loc=loc, ip=ip), loc=loc, ip=ip)),
            Float32(llvm.bitcast(T.f32(), hi.ir_value(loc=loc, ip=ip), loc=loc, ip=ip)))


@cute.jit
def residual_add(res: Float32, acc: Float32) -> Float32:
    """RESIDUAL: res + bf16(acc) in float32 (the caller rounds it to bf16 once more: torch's
    dst + bf16(y) in bf16). O_PROJ / DOWN's epilogues, their SPLITK_REDUCE and the folded
    RMSNORM."""
    return res + acc.to(BFloat16).to(Float32)


# Splits of a split-K reduce whose partial loads are issued together, before their adds: one L2
# round trip per SPLITS_IN_FLIGHT splits of an item instead of one per split or two (session 33:
# SPLITK_REDUCE's items and the folded RMSNORM's rows; QKV_ROPE's 13 splits at B <= 64 took 7
# round trips, GATE_UP's 4 took 3, the folded norm's 2 took 2 plus a reload of its own stores).
# The adds stay in split order (p0 + p1 + ..., the torch face's), so the sums are bitwise the
# same. Compile-time (MK_SPLITS_IN_FLIGHT): the loads' registers are allocated for all of them.
SPLITS_IN_FLIGHT = int(os.environ.get("MK_SPLITS_IN_FLIGHT", 4))
if not 1 <= SPLITS_IN_FLIGHT <= 8:
    raise ValueError(f"MK_SPLITS_IN_FLIGHT={SPLITS_IN_FLIGHT}: 1 .. 8 splits per round trip")


@cute.jit
def sum_splits(accs: list, sk_base: Int64, ld: Int64, stride: Int32, nsplit: Int32, row: Int32,
               cols: list, inflight: cutlass.Constexpr):
    """accs[i][0:8] = sum_j SPLITK[j * stride + row, cols[i] : cols[i] + 8] for every column
    offset cols[i], float32, j = 0 .. nsplit-1 in order (nsplit >= 1; sk_base: the byte address
    of SPLITK[0, 0], ld its pitch in elements). The loads of `inflight` splits of every column
    are issued before their adds: ceil(nsplit / inflight) round trips. A split past nsplit in
    the last group loads split nsplit - 1 again (no branch before the loads) and is not added."""
    nc = len(cols)
    parts = split_loads(sk_base, ld, stride, nsplit, row, cols, Int32(0), inflight)
    for i in cutlass.range_constexpr(nc):
        accs[i].store(parts[i])
    add_splits(accs, parts, nsplit, Int32(0), inflight)
    j0 = Int32(inflight)
    while j0 < nsplit:
        parts = split_loads(sk_base, ld, stride, nsplit, row, cols, j0, inflight)
        for i in cutlass.range_constexpr(nc):
            accs[i].store(accs[i].load() + parts[i])
        add_splits(accs, parts, nsplit, j0, inflight)
        j0 = j0 + inflight


@cute.jit
def split_loads(sk_base: Int64, ld: Int64, stride: Int32, nsplit: Int32, row: Int32, cols: list,
                j0: Int32, inflight: cutlass.Constexpr) -> list:
    """sum_splits' loads of splits j0 .. j0 + inflight - 1 (past nsplit: split nsplit - 1)."""
    parts = []
    for g in cutlass.range_constexpr(inflight):
        srow = Int64(imin(j0 + g, nsplit - 1) * stride + row)
        for i in cutlass.range_constexpr(len(cols)):
            parts.append(f32x8(sk_base + (srow * ld + Int64(cols[i])) * 4).load())
    return parts


@cute.jit
def add_splits(accs: list, parts: list, nsplit: Int32, j0: Int32, inflight: cutlass.Constexpr):
    """sum_splits' adds of splits j0 + 1 .. of split_loads' parts that are < nsplit."""
    nc = len(accs)
    for g in cutlass.range_constexpr(1, inflight):
        if j0 + g < nsplit:
            for i in cutlass.range_constexpr(nc):
                accs[i].store(accs[i].load() + parts[g * nc + i])


# The folded RMSNORM's splits in flight: O_PROJ / DOWN split in 2 where a norm folds their reduce
# (B <= 64 at 70B TP8); 4 vectors x 8 float32 per split, beside the row's sums and residual.
FOLD_IN_FLIGHT = min(SPLITS_IN_FLIGHT, 2)


@cute.jit
def fold_row(sk: cute.Tensor, nsplit: Int32, stride: Int32, src_base: Int64, row: Int32, H: Int32,
             cols: list, xs: list, store, ctid: Int32, nthreads: cutlass.Constexpr):
    """A folded RMSNORM's reduce of one row (mk/instructions/rows.py): for each 8-column vector v
    the thread owns in rmsnorm_consume, h = bf16(src + bf16(sum_j SPLITK[j * stride + row]))
    (float32 sum, j in order, as SPLITK_REDUCE), stored back into src (the residual stream's
    next value) and kept in xs[v] for the norm: one round trip for the residual and the first
    FOLD_IN_FLIGHT splits, none to read h back. cols: rmsnorm_consume's columns of the thread's
    vectors (a vector past H reads column H - 8 and is not stored)."""
    row64 = Int64(row)
    for v in cutlass.range_constexpr(NORM_VECS):     # the residual, then h in its registers
        xs[v].store(bf16x8(src_base + (row64 * Int64(H) + Int64(cols[v])) * 2).load())
    accs = []
    for v in cutlass.range_constexpr(NORM_VECS):
        accs.append(cute.make_rmem_tensor(cute.make_layout(8), Float32))
    sum_splits(accs, sk.iterator.toint(), Int64(sk.shape[1]), stride, nsplit, row, cols,
               FOLD_IN_FLIGHT)
    for v in cutlass.range_constexpr(NORM_VECS):
        # residual_add on the vector: res + bf16(acc) in float32, rounded to bf16
        xs[v].store((xs[v].load().to(Float32) + accs[v].load().to(BFloat16).to(Float32))
                    .to(BFloat16))
        if store and (v * nthreads + ctid) * 8 < H:
            bf16x8(src_base + (row64 * Int64(H) + Int64(cols[v])) * 2).store(xs[v].load())


@cute.jit
def load_rows(xs: list, src_base: Int64, row_offs: list, cols: list):
    """The group's rows (row_offs: element offsets of their first columns in the buffer) at the
    thread's columns into xs (rmsnorm_consume's row-major list of bf16 x 8 register tensors),
    every load issued first."""
    for k in cutlass.range_constexpr(len(row_offs)):
        for v in cutlass.range_constexpr(NORM_VECS):
            xs[k * NORM_VECS + v].store(
                bf16x8(src_base + (row_offs[k] + Int64(cols[v])) * 2).load())


@cute.jit
def store_normed(xs: list, ws: list, rs: Float32, dst_base: Int64, row_off: Int64, cols: list,
                 ctid: Int32, nthreads: cutlass.Constexpr, H: Int32):
    """One row's normalized vectors (xs: its bf16 x 8 registers in rmsnorm_consume's column
    order, rs its rsqrt statistic) into the destination rows at dst_base."""
    for v in cutlass.range_constexpr(NORM_VECS):
        if (v * nthreads + ctid) * 8 < H:
            xn = (xs[v].load().to(Float32) * rs).to(BFloat16)
            y = xn.to(Float32) * ws[v].to(Float32)
            bf16x8(dst_base + (row_off + Int64(cols[v])) * 2).store(y.to(BFloat16))


@cute.jit
def gathered_row(gather, row0: Int32, i: Int32):
    """(source row, 1) of row i of a norm in the variants that gather (gather = (meta, src_map,
    T)): row0 + i where src_map < 0 (RMSNORM), else meta[src_map + i] (LM_NORM's last rows,
    A_LAST_OFF), or (0, 0) where the metadata names a row outside the source buffer (the row is
    then not stored)."""
    src_row = row0 + i
    ok = Int32(1)
    if gather[1] >= 0:
        src_row = gather[0][gather[1] + i]
        if src_row < 0 or src_row >= gather[2]:
            src_row = Int32(0)
            ok = Int32(0)
    return src_row, ok


@cute.jit
def norm_groups(src_base: Int64, dst_base: Int64, row0: Int32, rows: Int32, H: Int32, cols: list,
                ws: list, scratch: Int32, eps: Float32, ctid: Int32, bar_id: cutlass.Constexpr,
                nthreads: cutlass.Constexpr, row_batch: cutlass.Constexpr, fold=None,
                scale=None, gather=None):
    """rmsnorm_consume's rows in groups of row_batch (see there); fold: (SPLITK workspace,
    nsplit, stride) of a folded norm, whose rows are fold_row's h, else None (rows loaded);
    scale: (scale_only, SPLITK workspace, T) in the variants with split-K, else None: where
    scale_only (a row-scale RMSNORM) thread 0 stores each row's rsqrt statistic into
    ROW_SCALE[row] (row_scale_at) and no normalized row is written (dst_base is not a buffer);
    gather: (meta, src_map, T) or None, see rmsnorm_consume (not with fold)."""
    warp = ctid // 32
    lane = ctid % 32
    inv_h = Float32(1.0) / Float32(H)
    last = rows - 1
    ngroups = ceil_div(rows, row_batch)
    for g in range(ngroups):
        r0 = g * row_batch
        row_offs = []   # destination rows (and the source rows, but for a gather)
        src_offs = row_offs
        row_ok = []     # a gathered row whose source lies in the buffer (else not stored)
        xs = []         # kept in bf16 until used: 4 registers a vector instead of 8
        for k in cutlass.range_constexpr(row_batch):
            row_offs.append(Int64(row0 + imin(r0 + k, last)) * Int64(H))
            for v in cutlass.range_constexpr(NORM_VECS):
                xs.append(cute.make_rmem_tensor(cute.make_layout(8), BFloat16))
        if cutlass.const_expr(gather is not None):
            src_offs = []
            for k in cutlass.range_constexpr(row_batch):
                src_row, ok = gathered_row(gather, row0, imin(r0 + k, last))
                src_offs.append(Int64(src_row) * Int64(H))
                row_ok.append(ok)
        if cutlass.const_expr(fold is None):
            load_rows(xs, src_base, src_offs, cols)
        else:
            # a group's missing rows (past `rows`) fold the last row again and store nothing
            for k in cutlass.range_constexpr(row_batch):
                fold_row(fold[0], fold[1], fold[2], src_base, row0 + imin(r0 + k, last), H,
                         cols, xs[k * NORM_VECS:(k + 1) * NORM_VECS], r0 + k < rows, ctid,
                         nthreads)
        # two scratch slots by group parity: a thread is at most one group ahead of another
        # (the barrier below), so one named barrier per group suffices
        slot = scratch + (g % 2) * (4 * NORM_WARPS * row_batch)
        parts = []      # the group's row k: one float32 per warp, at slot + k * 4 * NORM_WARPS
        for k in cutlass.range_constexpr(row_batch):
            parts.append(cute.make_tensor(
                cute.make_ptr(Float32, slot + k * 4 * NORM_WARPS, cute.AddressSpace.smem,
                              assumed_align=16),
                cute.make_layout(nthreads // 32)))
        for k in cutlass.range_constexpr(row_batch):
            ss = Float32(0.0)
            for v in cutlass.range_constexpr(NORM_VECS):
                if (v * nthreads + ctid) * 8 < H:
                    xf = xs[k * NORM_VECS + v].load().to(Float32)
                    ss = ss + (xf * xf).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            ss = warp_allreduce_sum(ss)
            if lane == 0:
                parts[k][warp] = ss
        cute.arch.barrier(barrier_id=bar_id, number_of_threads=nthreads)
        for k in cutlass.range_constexpr(row_batch):
            row_end = rows
            if cutlass.const_expr(gather is not None):
                row_end = rows * row_ok[k]      # a row gathered from outside stores nothing
            if r0 + k < row_end:
                tot = parts[k].load().reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                rs = cute.math.rsqrt(tot * inv_h + eps)
                xk = xs[k * NORM_VECS:(k + 1) * NORM_VECS]
                if cutlass.const_expr(scale is None):
                    store_normed(xk, ws, rs, dst_base, row_offs[k], cols, ctid, nthreads, H)
                else:
                    if scale[0]:
                        if ctid == 0:
                            row_scale_at(scale[1], scale[2], row0 + r0 + k)[0] = rs
                    else:
                        store_normed(xk, ws, rs, dst_base, row_offs[k], cols, ctid, nthreads, H)


@cute.jit
def rmsnorm_consume(src: Int32, dst: Int32, row0: Int32, rows: Int32, layer: Int32, which: Int32,
                    bufs: cute.Tensor, normw: cute.Tensor, n_layers: Int32, eps: Float32,
                    pool: Int32, full: cute.Pointer, done: cute.Pointer, pg: Int32,
                    npages: cutlass.Constexpr, ctid: Int32, bar_id: cutlass.Constexpr,
                    nthreads: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
                    ticket: Int32, mode: cutlass.Constexpr, share: cutlass.Constexpr,
                    sk=None, red_nsplit=None, red_stride=None,
                    row_batch: cutlass.Constexpr = NORM_ROW_BATCH, gather=None) -> Int32:
    """Both consumer warpgroups (nthreads = 256 threads, ctid 0..255): rows row0 .. row0+rows-1 of
    buffer src, normalized with norm-weight row which * n_layers + layer, into buffer dst; bufs is
    the arena (T, H, NBUF), H contiguous. Thread t owns the 16-byte vectors at columns
    (v * nthreads + t) * 8, v < NORM_VECS, in every row (so its norm weights are loaded once).
    Per group of row_batch rows: the thread's loads of every row issued together, a warp
    butterfly per row, the warps' partials through the page (two slots by group parity: one named
    barrier per group suffices), rsqrt, the stores.
    Numerics as mk.instructions.rows: y = bf16(bf16(x * rsqrt(mean(x^2) + eps)) * w), the sum
    of squares in float32 (in another order than torch's). sk (the split-K workspace, in the
    variants with split-K): a folded RMSNORM (red_nsplit > 0) first finishes O_PROJ's or DOWN's
    split tiles of each row (fold_row) and normalizes h from its registers; a row-scale RMSNORM
    (dst Buf.ROW_SCALE, only with sk) writes each row's rsqrt(mean(x^2) + eps) into ROW_SCALE
    (row_scale_at) and no normalized row (its norm weight is folded into the GEMM after it).
    row_batch: rows per group (NORM_ROW_BATCH; the megakernel's variants without GEMM slots pass
    1: the rows-only journal variant spilled 12 bytes with 2).
    gather (the megakernel's variants that run LM_NORM here, gat.GATHER_ROLE "consumers"):
    (meta, src_map, last_normed); where src_map >= 0 the instruction is an LM_NORM, whose row i
    is meta[src_map + i] of src (a sequence's last token row; red_nsplit 0) and goes to row
    row0 + i of last_normed (H columns, compact), normalized with the row `which`, `layer`
    name (NormWeight.FINAL, 0). One body for both: the gather costs RMSNORM a branch a row."""
    page, ph = page_of(pg, npages)
    bounded_bar_wait(full + page, ph, timeout_ns, state, ERR_PAGE_FULL, ticket)
    T = bufs.shape[0]
    H = bufs.shape[1]
    warp = ctid // 32
    lane = ctid % 32
    wrow = which * n_layers + layer
    # a vector past H is loaded from column H - 8 instead (the same 16 bytes for the whole warp
    # when H is a multiple of 2048: one transaction) and neither summed nor stored; the loads then
    # need no branch, so each row's are all in flight at once
    cols = []
    ws = []
    for v in cutlass.range_constexpr(NORM_VECS):
        c = (v * nthreads + ctid) * 8
        if c > H - 8:
            c = H - 8
        cols.append(c)
        ws.append(norm_weight(normw, wrow, c))
    src_base = (bufs.iterator + src * (T * H)).toint()
    dst_base = (bufs.iterator + dst * (T * H)).toint()
    rows_from = None
    if cutlass.const_expr(gather is not None):
        rows_from = (gather[0], gather[1], T)
        if gather[1] >= 0:
            dst_base = gather[2].iterator.toint()
    scratch = pool + page * PAGE
    if cutlass.const_expr(sk is None):
        norm_groups(src_base, dst_base, row0, rows, H, cols, ws, scratch, eps, ctid, bar_id,
                    nthreads, row_batch, gather=rows_from)
    else:
        # a row-scale RMSNORM (destination ROW_SCALE; the norm folded into the next GEMM) stores
        # only the statistic, into the SPLITK allocation's tail: only with split-K compiled in
        scale = (dst == BUF_ROW_SCALE, sk, T)
        if red_nsplit > 0:
            # a folded norm walks its rows one by one: they are few (one per instruction at
            # B <= 64) and the fold's loads take the registers a second row's would
            norm_groups(src_base, dst_base, row0, rows, H, cols, ws, scratch, eps, ctid, bar_id,
                        nthreads, 1, (sk, red_nsplit, red_stride), scale)
        else:
            norm_groups(src_base, dst_base, row0, rows, H, cols, ws, scratch, eps, ctid, bar_id,
                        nthreads, row_batch, None, scale, rows_from)
    if lane == 0:
        # the scratch partials were generic writes; a later use of the page is a TMA write
        cute.arch.fence_proxy("async.shared", space="cta")
    release(done + page, share, nthreads, ctid, bar_id, mode)
    return pg + 1


@cute.jit
def store_handoff(empty: cute.Pointer, done: cute.Pointer, dpar: cute.Tensor, pg: Int32,
                  npages: cutlass.Constexpr, sid: Int32, timeout_ns: Int64, state: cute.Tensor,
                  ticket: Int32, share: cutlass.Constexpr, nthreads: cutlass.Constexpr) -> Int32:
    """Storer warps of a body whose consumers store to global memory themselves (RMSNORM,
    SPLITK_REDUCE): wait for their `done` on the instruction's one page (their stores precede
    it), free the page; the megakernel's signal follows. Returns the new page count."""
    page, _ = page_of(pg, npages)
    wait_done(done, page, dpar, timeout_ns, state, ticket)
    free_waited_page(page, empty, sid, nthreads, share)
    return pg + 1


# ------------------------------------------------------------------------------------ storer
@cute.jit
def rows_store(op: Int32, dst: Int32, row0: Int32, rows: Int32, col0: Int32, cols: Int32,
               bufs: cute.Tensor, pool: Int32, empty: cute.Pointer, done: cute.Pointer,
               dpar: cute.Tensor, pg: Int32,
               npages: cutlass.Constexpr, sid: Int32, bar_id: cutlass.Constexpr,
               nthreads: cutlass.Constexpr, timeout_ns: Int64, state: cute.Tensor,
               ticket: Int32, mode: cutlass.Constexpr, share: cutlass.Constexpr) -> Int32:
    """Storer warps (nthreads threads): copy each result page to global memory with exact masks,
    then free the page. bufs is the arena (T, H, NBUF) with H contiguous. share: the empty[p]
    init count (the megakernel's page_share)."""
    T = bufs.shape[0]
    H = bufs.shape[1]
    nrg = ceil_div(rows, PR)
    ncc = ceil_div(cols, PC)
    row_end = row0 + rows
    col_end = col0 + cols
    step = Int32(1)
    if op == OP_RESIDUAL_ADD:
        step = Int32(2)
    base = bufs.iterator + dst * (T * H)
    for i in range(nrg * ncc):
        g = i // ncc
        cc = i % ncc
        q = pg + step - 1          # the result page of this chunk
        page = q % npages
        wait_done(done, page, dpar, timeout_ns, state, ticket)
        r0 = row0 + g * PR
        c0 = col0 + cc * PC
        for it in range(PR * (PC // 8) // nthreads):
            vi = it * nthreads + sid
            rr = vi // (PC // 8)
            cv = vi % (PC // 8)
            row = r0 + rr
            col = c0 + cv * 8
            if row < row_end:
                if col < col_end:
                    box = cv // (BOXC // 8)
                    within = cv % (BOXC // 8)
                    s = cute.make_tensor(
                        cute.make_ptr(Int32, pool + page * PAGE + box * BOX_BYTES + rr * ROW_BYTES
                                      + within * 16, cute.AddressSpace.smem, assumed_align=16),
                        cute.make_layout(4))
                    d = cute.make_tensor(
                        cute.make_ptr(Int32, (base + (row * H + col)).toint(), cute.AddressSpace.gmem,
                                      assumed_align=16),
                        cute.make_layout(4))
                    d.store(s.load())
        release(empty + page, share, nthreads, sid, bar_id, mode)
        pg = pg + step
    return pg
