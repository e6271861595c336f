"""Compile gate (CPU, CI): the megakernel (rows family only: the variant of rows-only plans; and the
all-opcode variant of a TP=1 model step: rows + the 5 GEMM slots of an M class + attention +
EMBED/LM_NORM, without and with split-K) compiles for sm_90a with fake tensors, its PTX holds the
instructions its roles are meant to use, and ptxas reports no spills and no C7506/C7508/C7510. The
single-opcode GEMM variants: tests/test_gemm_compile.py. Also check_plan on split-K plans of
mk.plan (CPU: the refusals before a launch)."""

from __future__ import annotations

import os
import re

import pytest

from _compile_gate import (assert_clean, assert_split_variant, dump_dir,  # noqa: F401
                           ptxas_report, probe_module, swapped_probe)  # (env set first)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.compile

REQUIRED_PTX = {
    "setmaxnreg": r"setmaxnreg\.(inc|dec)",
    "cp.async.bulk.tensor": r"cp\.async\.bulk\.tensor",
    "ld.acquire": r"ld\.acquire\.gpu",
    "release atomic": r"(red|atom)\.release\.gpu",
    "nanosleep": r"nanosleep",
    "mbarrier try_wait": r"mbarrier\.try_wait",
    "globaltimer (bounded waits)": r"%globaltimer",
}


def compile_to_ptx(journal: bool, handoff: str | None = None, gemm: tuple = ()) -> str:
    """Compile the megakernel with fake (dynamic-shape) tensors; return its PTX text."""
    import mk.megakernel as M
    comp = M.compile_fake(journal=journal, handoff=handoff or M.DEFAULT_HANDOFF, gemm=gemm)
    assert comp.__ptx__, "no PTX kept"
    return comp.__ptx__


@pytest.mark.parametrize("journal,handoff", [(False, None), (True, None), (False, "warp"),
                                             (False, "group")],
                         ids=["plain", "journal", "handoff-warp", "handoff-group"])
def test_megakernel_compiles_for_sm90a(dump_dir, journal, handoff):
    ptx = compile_to_ptx(journal, handoff)
    missing = [k for k, rx in REQUIRED_PTX.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    rep = ptxas_report(ptx, os.path.join(dump_dir, f"rows_{journal}_{handoff}"))
    regs = assert_clean(rep)
    import mk.megakernel as M
    assert M.reg_split_ok(M.REG_LOW, M.REG_HIGH, regs), (regs, M.REG_LOW, M.REG_HIGH)
    print(rep.strip().splitlines()[-3:])


# (M class, KV page size): decode, mid, prefill classes of the tile table
FULL_VARIANTS = [(64, 16), (256, 16), (1024, 64)]
# Every megakernel variant compiles with 0 spills and no stack frame. Sessions 32-33 allowed up to
# 24 / 96 B (stores / loads; ptxas kept the consumer loop's instruction count, ticket or
# attention's head loop bounds in local memory: M64 without split-K 8 / 8, M1024 12 / 32, M4096
# with split-K 12 / 88, the journal variant 16 / 36) after the swapped decode chain became the
# default. The pressure was not the swapped softmax's state: S (the m64n64 chain's 32 registers,
# the swapped S^T's 4) and P (16) were read behind tests the compiler could not tie to the ones
# that wrote them, so they were carried from instruction to instruction, live across the whole
# persistent loop; ak.attn_blocks now writes them on every path (session 34).


@pytest.mark.parametrize("m,page_size", FULL_VARIANTS, ids=[f"M{m}-ps{p}" for m, p in FULL_VARIANTS])
def test_all_opcode_variant_compiles_without_spills(dump_dir, m, page_size):
    """The variant a TP=1 model step runs: every opcode but TP_REDUCE in one kernel. Its consumer
    runs at the QKV_ROPE split (80/208) and holds 5 GEMM bodies + the attention consumer; the
    storer holds the GEMM, attention and gather storers. No spill, no stack frame."""
    import mk.megakernel as M
    slots = M.class_slots(m)
    assert {g.op for g in slots} == set(M.GEMM_OPS)
    comp = M.compile_fake(gemm=slots, attn_page_size=page_size, gather=True)
    ptx = comp.__ptx__
    missing = [k for k, rx in REQUIRED_PTX.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    assert re.search(r"wgmma\.mma_async", ptx) and re.search(r"ex2\.approx", ptx)
    # the swapped decode chain beside the m64n64 one (attn_consume traced once per chain): S^T
    # (8 m64n8k16, K-major) and O^T (8, the V page read M-major)
    modes = swapped_probe().wgmma_modes(ptx)
    assert modes.get(("m64n8k16", 0, 0)) == 8 and modes.get(("m64n8k16", 1, 0)) == 8, modes
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    # no split-K code unless compiled in (the unsplit bodies' PTX is what it was before split-K)
    assert not re.search(r"st\.global\.v2\.b32", ptx), "split-K partial stores compiled in"
    rep = ptxas_report(ptx, os.path.join(dump_dir, f"full_M{m}_ps{page_size}"))
    regs = assert_clean(rep)
    low, high = M.reg_split(slots)
    assert M.reg_split_ok(low, high, regs), (regs, low, high)
    print(f"M{m} ps{page_size} split {low}/{high}",
          [ln.strip() for ln in rep.splitlines() if "registers" in ln or "spill" in ln])


@pytest.mark.parametrize("handoff", ["warp", "group"])
def test_attention_variant_other_handoffs_compile(dump_dir, handoff):
    """The attention bodies follow the page barriers' share of every hand-off mode (256 for the
    default "thread", 8 for "warp" / "group"): rows + attention + gather, no spills."""
    import mk.megakernel as M
    comp = M.compile_fake(handoff=handoff, attn_page_size=16, gather=True)
    rep = ptxas_report(comp.__ptx__, os.path.join(dump_dir, f"attn_{handoff}"))
    assert_clean(rep)


def test_import_mk_does_not_load_cutlass():
    import subprocess
    import sys
    code = ("import sys, mk, mk.instructions.base as b; b._load_all(); "
            "import mk.trace; assert 'cutlass' not in sys.modules, 'cutlass imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------- split-K
# the step's variants (split-K compiled in), with the class above 1024 tokens too (gu_m128's
# wide chain runs only there), each with the split tiles its class's default plans may run
# (mk.megakernel_step.class_split_ops: every opcode's up to 256 tokens, QKV_ROPE's up to 1024,
# none above), and the M1024 class with every opcode's (a PlanConfig raising the caps)
STEP_VARIANTS = [(m, p, "class") for m, p in FULL_VARIANTS + [(4096, 16)]] + [(1024, 64, "all")]


@pytest.mark.parametrize("m,page_size,splits", STEP_VARIANTS,
                         ids=[f"M{m}-ps{p}-{s}" for m, p, s in STEP_VARIANTS])
def test_all_opcode_splitk_variant_compiles_without_spills(dump_dir, m, page_size, splits):
    """The all-opcode variant with split-K compiled in (Megakernel(splitk=...)): the partial store
    of every slot that runs split tiles with bodies of its own (8-byte float32 stores, one per
    accumulator pair: the expected count; none for the others, GemmSlot.splits; a twin slot
    runs its host's) and the SPLITK_REDUCE bodies; no
    spill, no stack frame, no call at the QKV_ROPE split 80/208 (the consumer had a register or
    two of headroom at M1024 before split-K)."""
    import mk.megakernel as M
    from mk.megakernel_step import class_split_ops, default_plan_config
    split_ops = class_split_ops(default_plan_config(), m) if splits == "class" else None
    slots = M.class_slots(m, split_ops=split_ops)
    comp = M.compile_fake(gemm=slots, attn_page_size=page_size, gather=True, splitk=True)
    want = sum(g.cfg.acc_regs() // 2 for g in slots
               if g.op in M.SPLITK_OPS and g.splits and g.twin_of < 0)
    assert (want == 0) == (m > 1024 and splits == "class"), want
    regs = assert_split_variant(comp.__ptx__, REQUIRED_PTX, want,
                                os.path.join(dump_dir, f"full_splitk_M{m}_ps{page_size}_{splits}"))
    low, high = M.reg_split(slots)
    assert M.reg_split_ok(low, high, regs), (regs, low, high)
    # PlanConfig.norm_fold=2's epilogue wait: the loader's counter wait in the QKV_ROPE and
    # GATE_UP slots beside the controller's (each rk.wait_counter has one nanosleep), also where
    # the slot runs no split tiles
    assert len(re.findall(r"nanosleep", comp.__ptx__)) == 3
    print(f"M{m} ps{page_size} splitk ({splits}) split {low}/{high}")


def test_self_scale_variant_compiles_without_spills(dump_dir):
    """PlanConfig.norm_fold=3's variant of the class above 1024 tokens (QKV_ROPE and GATE_UP
    unsplit there, both self-scaled: Megakernel(self_scale=True), GemmSlot.self_scale): 0 spills,
    no stack frame, no call, the register split kept; per self-scaled slot four 16-byte shared
    loads of the A page in the mainloop (row_sumsq: two chunks of two rows), two shuffles per
    row and one rsqrt per row more than the default variant (scale_own_rows)."""
    import mk.megakernel as M
    from mk.megakernel_step import class_split_ops, default_plan_config
    split_ops = class_split_ops(default_plan_config(norm_fold=3), 4096)
    counts = {}
    for own in (False, True):
        slots = M.class_slots(4096, split_ops=split_ops, self_scale=own)
        assert sum(g.self_scale for g in slots) == (2 if own else 0)
        ptx = M.compile_fake(gemm=slots, attn_page_size=16, gather=True, splitk=True).__ptx__
        counts[own] = [len(re.findall(rx, ptx)) for rx in
                       (r"ld\.shared\.v4", r"shfl\.sync\.bfly", r"rsqrt\.approx")]
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    regs = assert_clean(ptxas_report(ptx, os.path.join(dump_dir, "self_scale_M4096")))
    low, high = M.reg_split(slots)
    assert M.reg_split_ok(low, high, regs), (regs, low, high)
    assert [b - a for a, b in zip(counts[False], counts[True])] == [8, 8, 4], counts


def test_twin_slots_pair_only_opcodes_of_one_body():
    """pair_twins (MK_GEMM_TWIN): DOWN runs through O_PROJ's bodies in every M class (the same
    tile, RESIDUAL epilogue, K word, split code and destination); nothing else pairs, nor O_PROJ
    / DOWN when their split code differs or their destinations are different tensors (the
    host's operands: gemm_slots); off, the slots are as before."""
    import torch

    import mk.megakernel as M
    from mk.ir import Op
    for m in (64, 256, 1024, 4096):
        slots = M.class_slots(m, twin=False)
        twins = {Op(s.op).name: s.twin_of for s in M.pair_twins(slots, twin=True)}
        assert twins == {"QKV_ROPE": -1, "O_PROJ": -1, "GATE_UP": -1, "DOWN": int(Op.O_PROJ),
                         "LM_HEAD": -1}, (m, twins)
        assert M.pair_twins(slots, twin=False) == slots
        assert all(s.twin_of < 0 for s in M.pair_twins(slots, lambda a, b: False, twin=True))
    only_o = M.class_slots(1024, split_ops={int(Op.O_PROJ)}, twin=True)
    assert all(s.twin_of < 0 for s in only_o)
    # the host's operands: one arena for both destinations pairs them, two tensors do not
    x, w = torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
    arena = torch.zeros(3, 8, 64, dtype=torch.bfloat16)
    G = M.GemmOperands
    one = {Op.O_PROJ: G(x, w, arena, 5, 0), Op.DOWN: G(x, w, arena, 6, 0)}
    got = {Op(s.op): s.twin_of for s in M.gemm_slots(one, 64, twin=True)}
    assert got == {Op.O_PROJ: -1, Op.DOWN: int(Op.O_PROJ)}, got
    two = {Op.O_PROJ: G(x, w, arena, 5, 0), Op.DOWN: G(x, w, arena.clone(), 6, 0)}
    assert all(s.twin_of < 0 for s in M.gemm_slots(two, 64, twin=True))


def test_twin_variant_runs_down_through_o_proj_bodies_without_spills(dump_dir):
    """MK_GEMM_TWIN's all-opcode M1024 variant (as the backend builds it: split code for
    QKV_ROPE only) compiles clean (no spill, no call), and its GEMM-only build has exactly the
    wgmmas of the build without DOWN (DOWN runs O_PROJ's consumer), more TMA load sites (the
    loader's twin issues) and loads from DOWN's own x / w descriptors."""
    import mk.megakernel as M
    from mk.ir import Op
    from mk.megakernel_step import class_split_ops, default_plan_config
    split_ops = class_split_ops(default_plan_config(), 1024)
    twin = M.class_slots(1024, split_ops=split_ops, twin=True)
    comp = M.compile_fake(gemm=twin, attn_page_size=64, gather=True, splitk=True)
    assert not re.search(r"^\s*call", comp.__ptx__, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(comp.__ptx__, os.path.join(dump_dir, "full_twin_M1024")))
    apart = M.class_slots(1024, split_ops=split_ops, twin=False)
    no_down = tuple(s for s in apart if s.op != int(Op.DOWN))
    ptx = {name: M.compile_fake(gemm=slots, splitk=True).__ptx__
           for name, slots in (("twin", twin), ("no_down", no_down), ("apart", apart))}
    mma, loads = ptx_counts(ptx, r"wgmma\.mma_async"), ptx_counts(ptx, r"cp\.async\.bulk\.tensor")
    assert mma["twin"] == mma["no_down"] > 0, mma
    assert loads["twin"] > loads["no_down"], loads
    # DOWN's own x / w descriptors are still loaded from (by O_PROJ's loader): against the build
    # with DOWN's own bodies (the same kernel parameters) only DOWN's residual descriptor goes
    # unread (the tile's residual comes through O_PROJ's, a view of the same HIDDEN arena)
    used = {name: tma_load_params(ptx[name]) for name in ("twin", "apart")}
    assert used["twin"] < used["apart"] and len(used["apart"] - used["twin"]) == 1, used


def tma_load_params(ptx: str) -> set:
    """The kernel parameters (indices) whose TMA descriptors feed a global-to-shared
    cp.async.bulk.tensor load in ptx: `mov.b64 %rdN, <kernel>_param_K` then `cvta.param.u64
    %rdX, %rdN` give the descriptor register of each load."""
    param = dict(re.findall(r"mov\.b64\s+(%rd\d+),\s+\w+_param_(\d+);", ptx))
    desc = {x: param[n] for x, n in re.findall(r"cvta\.param\.u64\s+(%rd\d+),\s+(%rd\d+);", ptx)
            if n in param}
    loads = re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global\S*\s+\[[^]]+\],"
                       r"\s+\[(%rd\d+),", ptx)
    assert loads and all(r in desc for r in loads), "a TMA load whose descriptor is not a param"
    return {int(desc[r]) for r in loads}


NO_FOLD = {"fold_o_reduce": 0, "fold_down_reduce": 0}


def _tiny_step_plan(split_k: int, tokens=(1, 13, 64, 130), **plan_kw):
    """A prefill step of the tiny head_dim-128 model (mk.tiny) planned with split_k, and the
    megakernel operands' shapes of mk.megakernel_step (meta tensors: shapes only)."""
    from mk.batch import SeqChunk, StepBatch
    from mk.config import ParallelConfig
    from mk.engine import PageManager, default_kernel_config
    from mk.instructions.base import Buf
    from mk.megakernel_step import meta_operands
    from mk.plan import PlanConfig, Planner, buffer_shapes
    from mk.tiny import TINY_HD128_CONFIG as cfg
    kernel = default_kernel_config(cfg, max_seqs=8, max_context=512, max_batch_tokens=512)
    # a 208-token step splits only with splitk_max_tokens raised past the default 128
    pcfg = PlanConfig(split_k=split_k, **{"splitk_max_tokens": 256, **plan_kw})
    plan = Planner(cfg, ParallelConfig(), kernel, pcfg)
    pages = PageManager(kernel.kv_pages, kernel.page_size)
    chunks = []
    for i, n in enumerate(tokens):
        pages.allocate(i, n + 1)
        chunks.append(SeqChunk([1] * n, 0, pages.pages(i)))
    p = plan.plan(StepBatch(chunks))
    nbuf, T, H, kw = meta_operands(cfg, kernel, pcfg, sum(tokens))
    kw.pop("splitk_shape")
    _tiny_step_plan.last_plan = p
    return p.instrs, (nbuf, T, H), kw, tuple(buffer_shapes(cfg, ParallelConfig(), kernel, pcfg)[Buf.SPLITK])


@pytest.mark.parametrize("split_k", [2, 4, 8])
def test_check_plan_accepts_split_plans_with_the_workspace(split_k):
    """mk.plan's forced split-K plans of the tiny model pass check_plan with the SPLITK workspace
    of mk.plan.buffer_shapes (words, K slices, workspace rows and columns agree), and are refused
    without it."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.ir import W_OPCODE
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(split_k)
    assert int((instrs[:, W_OPCODE] == M.OP_SPLITK_REDUCE).sum()) > 0
    assert int((instrs[:, M.gk.A_NSPLIT] == split_k).sum()) > 0
    M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    with pytest.raises(ValueError, match="SPLITK workspace"):
        M.check_plan(instrs, nbuf, T, H, 1 << 20, **kw)
    # the default plan (split_k=1) has no split words at all
    instrs1, _, kw1, sk1 = _tiny_step_plan(1)
    assert sk1[0] == 0 and int((instrs1[:, M.gk.A_NSPLIT] >= 2).sum()) == 0
    M.check_plan(instrs1, nbuf, T, H, 1 << 20, **kw1)


@pytest.mark.parametrize("fold", ["o", "down"])
def test_check_plan_folded_reduce(fold):
    """PlanConfig.fold_o_reduce / fold_down_reduce: the forced split-K plan of the tiny model
    without O_PROJ's (DOWN's) per-layer reduces (the MLP (next attention) norms fold them; the
    last layer's DOWN is reduced in the final section) passes check_plan with the SPLITK
    workspace, and is refused without it, with partial rows past the workspace or with negative
    reduce words."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.instructions import rows as rw
    from mk.instructions import splitk as skf
    from mk.instructions.base import NormWeight
    from mk.ir import W_OPCODE, Op
    op, which, kw_fold = {"o": (Op.O_PROJ, NormWeight.MLP,
                                {"fold_o_reduce": 1, "fold_down_reduce": 0}),
                          "down": (Op.DOWN, NormWeight.ATTN,
                                   {"fold_o_reduce": 0, "fold_down_reduce": 1})}[fold]
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(4, **kw_fold)
    layout = _tiny_step_plan.last_plan.layout
    norms = instrs[instrs[:, W_OPCODE] == int(Op.RMSNORM)]
    folded = norms[norms[:, rw.A_RED_NSPLIT] == 4]
    assert len(folded) and len(folded) < len(norms)
    assert (folded[:, rw.A_NORM_WEIGHT] == int(which)).all()
    red = instrs[instrs[:, W_OPCODE] == M.OP_SPLITK_REDUCE]
    n_final = int((red[:, skf.A_OP] == int(op)).sum())
    # DOWN: only the final section's reduces (one per tile of the last layer)
    assert len(red) and n_final == (layout["splitk"]["DOWN"][0] if fold == "down" else 0)
    M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    with pytest.raises(ValueError, match="SPLITK workspace"):
        M.check_plan(instrs, nbuf, T, H, 1 << 20, **kw)
    with pytest.raises(ValueError, match="folded RMSNORM reads SPLITK row"):
        M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=(T, sk_shape[1]), **kw)
    bad = instrs.clone()
    i = int((bad[:, W_OPCODE] == int(Op.RMSNORM)).nonzero().flatten()[0])
    bad[i, rw.A_RED_STRIDE] = -1
    with pytest.raises(ValueError, match="reduce words"):
        M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)


@pytest.mark.parametrize("reduce_rows", [16, 5])
def test_check_plan_accepts_reduce_row_slices(reduce_rows):
    """PlanConfig.splitk_reduce_rows: the SPLITK_REDUCE row slices of a forced split-K plan pass
    check_plan (each slice is checked as the unsplit tile rows it finishes), and there are more
    of them than whole-tile reduces, covering the same rows."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.ir import W_OPCODE, W_ROWS
    # (num_sms high enough that the reduces-per-op cap leaves the slices at reduce_rows)
    # (unfolded: the folds, on by default, leave O_PROJ / DOWN no per-layer reduce to slice)
    # (gate_up_reduce_rows=0: GATE_UP's slices at reduce_rows too)
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(4, splitk_reduce_rows=reduce_rows,
                                                        gate_up_reduce_rows=0,
                                                        splitk_reduce_max_tokens=4096,
                                                        num_sms=4096, **NO_FOLD)
    M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    whole, _, _, _ = _tiny_step_plan(4, splitk_reduce_rows=0, **NO_FOLD)
    red = instrs[instrs[:, W_OPCODE] == M.OP_SPLITK_REDUCE]
    red_whole = whole[whole[:, W_OPCODE] == M.OP_SPLITK_REDUCE]
    assert len(red) > len(red_whole) and int(red[:, W_ROWS].max()) <= reduce_rows
    assert int(red[:, W_ROWS].sum()) == int(red_whole[:, W_ROWS].sum())


def test_check_plan_refuses_bad_split_words():
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import ARG0, W_COLS, W_OPCODE, Op
    # (unfolded: a folded norm's SPLITK reads are refused first with a workspace too small)
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(4, **NO_FOLD)
    ops = instrs[:, W_OPCODE]
    split = (instrs[:, gk.A_NSPLIT] >= 2).nonzero().flatten()
    red = (ops == M.OP_SPLITK_REDUCE).nonzero().flatten()

    def refused(mutate, match, shape=sk_shape):
        bad = instrs.clone()
        mutate(bad)
        with pytest.raises(ValueError, match=match):
            M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=shape, **kw)

    i, r = int(split[0]), int(red[0])
    refused(lambda s: s.__setitem__((i, gk.A_K0), 32), "K0 a multiple of 64")
    refused(lambda s: s.__setitem__((i, gk.A_SPLIT_J), 4), "0 <= j < nsplit")
    refused(lambda s: None, "rows outside the SPLITK", shape=(8, sk_shape[1]))
    refused(lambda s: None, "columns outside the SPLITK", shape=(sk_shape[0], 64))
    refused(lambda s: s.__setitem__((r, ARG0), int(Op.LM_HEAD)), "SPLITK_REDUCE of opcodes")
    refused(lambda s: s.__setitem__((r, W_COLS), 12), "multiples of 8")
    lm = int((ops == int(Op.LM_HEAD)).nonzero().flatten()[0])
    refused(lambda s: s.__setitem__((lm, gk.A_NSPLIT), 2), "never split")


def test_check_plan_attention_pairs():
    """PlanConfig.attn_pair: a step of one-token sequences planned with pairs (MODE_PAIR words)
    passes check_plan; a pair whose second unit's row is outside the buffers, whose A_NEW0_B is
    past its position, or whose first unit has several rows is refused."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.instructions import attention as at
    from mk.ir import W_OPCODE, W_ROWS, Op
    instrs, (nbuf, T, H), kw, _ = _tiny_step_plan(1, tokens=(1,) * 6, attn_pair=2)
    a = (instrs[:, W_OPCODE] == int(Op.ATTENTION)).nonzero().flatten()
    pairs = a[instrs[a, at.A_MODE] == at.MODE_PAIR]
    assert len(pairs) == 3 * (len(a) // 3)     # 6 units of one block: 3 pairs in every layer
    M.check_plan(instrs, nbuf, T, H, 1 << 20, **kw)
    i = int(pairs[0])
    for word, value in ((at.A_ROW0_B, T), (at.A_NEW0_B, int(instrs[i, at.A_POS0_B]) + 1),
                        (W_ROWS, 2), (at.A_MODE, 3)):
        bad = instrs.clone()
        bad[i, word] = value
        with pytest.raises(ValueError, match="mode must be|pair"):
            M.check_plan(bad, nbuf, T, H, 1 << 20, **kw)


@pytest.mark.parametrize("split_k", [1, 4])
def test_check_plan_on_representative_rows_equals_the_full_check(split_k):
    """mk.megakernel_step checks only StepPlan.representative_rows: on a planner stream it gives
    the full check's counter count, and a bad word in the first or last layer is still refused
    (a middle layer's rows are those rows shifted, tests/test_plan.py)."""
    pytest.importorskip("cutlass")
    import torch

    import mk.megakernel as M
    from mk.ir import W_COLS, W_OPCODE
    from mk.ir import Op as O
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(split_k)
    plan = _tiny_step_plan.last_plan
    rows = plan.representative_rows()
    assert rows is not None and len(rows) < len(instrs)
    full = M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    assert M.check_plan(instrs[rows], nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw) == full
    assert torch.equal(plan.representative_stream(), instrs[rows])
    norm = (instrs[:, W_OPCODE] == int(O.RMSNORM)).nonzero().flatten()
    for i in (int(norm[0]), int(norm[-1])):          # first layer's, last layer's
        bad = instrs.clone()
        bad[i, W_COLS] = 8
        with pytest.raises(ValueError, match="whole row"):
            M.check_plan(bad[rows], nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)


# -------------------------------------------------------------------- row scale (norm fold)
def test_rows_splitk_variant_compiles_without_spills(dump_dir):
    """The rows-only variant with split-K compiled in (Megakernel(splitk=...) without GEMM slots):
    the folded RMSNORM and the row-scale RMSNORM (destination ROW_SCALE, PlanConfig.norm_fold:
    thread 0's float32 store into the SPLITK allocation's tail) with one row per group; no spill,
    no stack frame. (The step variants with them: test_all_opcode_splitk_variant_....)"""
    import mk.megakernel as M
    comp = M.compile_fake(splitk=True)
    assert not re.search(r"^\s*call", comp.__ptx__, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(comp.__ptx__, os.path.join(dump_dir, "rows_splitk")))


def _row_scale_norm(H: int, rows: int = 3):
    """One row-scale RMSNORM (destination ROW_SCALE) of rows 5 .. 5 + rows."""
    from mk.instructions.base import Buf
    from mk.instructions.rows import rows_instruction
    from mk.ir import Op, serialize
    return serialize([rows_instruction(Op.RMSNORM, Buf.HIDDEN, Buf.ROW_SCALE, 5, rows, 0, H)])


def test_check_plan_row_scale_norm_needs_the_splitk_workspace():
    """A row-scale RMSNORM passes check_plan with a SPLITK workspace (ROW_SCALE is its last T
    floats) and is refused, the instruction named, without one; ROW_SCALE is no destination of
    COPY / RESIDUAL_ADD, and a workspace too small for ROW_SCALE is refused."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.instructions.base import Buf
    from mk.instructions.rows import A_DST
    from mk.ir import W_OPCODE, Op
    T, H = 64, 1024
    norm = _row_scale_norm(H)
    M.check_plan(norm, 3, T, H, 16, splitk_shape=(1, 1024))     # 1024 floats >= T
    with pytest.raises(ValueError, match=r"instruction 0 \(layer 0, rows 5\+3\) is a RMSNORM "
                                         r"into ROW_SCALE .* SPLITK workspace"):
        M.check_plan(norm, 3, T, H, 16)
    for op in (Op.COPY, Op.RESIDUAL_ADD):
        bad = norm.clone()
        bad[:, W_OPCODE] = int(op)
        with pytest.raises(ValueError, match="beyond the arena"):
            M.check_plan(bad, 3, T, H, 16, splitk_shape=(1, 1024))
    with pytest.raises(ValueError, match="no room for ROW_SCALE's 64 floats in its last 8 rows"):
        M.check_plan(norm, 3, T, H, 16, splitk_shape=(7, 8))
    assert int(norm[0, A_DST]) == int(Buf.ROW_SCALE)


def _partial_rows_end(instrs) -> int:
    """SPLITK rows the split tiles of a stream write: max of j * stride + row0 + rows."""
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import W_ROW0, W_ROWS
    s = instrs[instrs[:, gk.A_NSPLIT] >= 2]
    return int((s[:, gk.A_SPLIT_J] * s[:, gk.A_SPLIT_ROW] + s[:, W_ROW0] + s[:, W_ROWS]).max())


def test_check_plan_norm_fold():
    """PlanConfig.norm_fold: the forced split-K plan of the tiny model (row-scale RMSNORMs where
    a norm finishes no split reduce; QKV_ROPE's and GATE_UP's reduces row-scaled) passes check_plan with mk.plan's
    SPLITK workspace, and with one just big enough: its partial rows and ROW_SCALE's
    (mk.plan.row_scale_rows) after them; one row less is refused (a partial would overwrite
    ROW_SCALE), though the same stream without its row scales may use those rows. Refused too:
    no workspace, the row scale word on a DOWN reduce, a row-scaled reduce past the T rows."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.instructions import rows as rw
    from mk.instructions import splitk as skf
    from mk.instructions.base import Buf
    from mk.ir import W_OPCODE, W_ROW0, Op
    from mk.plan import row_scale_rows
    # O_PROJ's and DOWN's reduces on their own (a norm that finishes one stays a full RMSNORM)
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(4, norm_fold=1, fold_o_reduce=0,
                                                         fold_down_reduce=0)
    ops = instrs[:, W_OPCODE]
    scale_norm = (ops == int(Op.RMSNORM)) & (instrs[:, rw.A_DST] == int(Buf.ROW_SCALE))
    red = ops == M.OP_SPLITK_REDUCE
    scaled = red & (instrs[:, skf.A_ROW_SCALE] != 0)
    assert scale_norm.any()
    assert set(instrs[scaled, skf.A_OP].tolist()) == {int(Op.QKV_ROPE), int(Op.GATE_UP)}
    M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    width = sk_shape[1]
    end = _partial_rows_end(instrs)
    snug = end + row_scale_rows(T, width)
    assert snug <= sk_shape[0]
    M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=(snug, width), **kw)
    with pytest.raises(ValueError, match="SPLITK row|rows outside the SPLITK"):
        M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=(snug - 1, width), **kw)
    unscaled = instrs.clone()
    unscaled[scale_norm, rw.A_DST] = int(Buf.NORMED)
    unscaled[red, skf.A_ROW_SCALE] = 0
    M.check_plan(unscaled, nbuf, T, H, 1 << 20, splitk_shape=(end, width), **kw)
    with pytest.raises(ValueError, match="ROW_SCALE lies in the SPLITK workspace"):
        M.check_plan(instrs, nbuf, T, H, 1 << 20, **kw)
    bad = instrs.clone()
    down = int((red & (instrs[:, skf.A_OP] == int(Op.DOWN))).nonzero().flatten()[0])
    bad[down, skf.A_ROW_SCALE] = 1
    with pytest.raises(ValueError, match=r"SPLITK_REDUCE of \['DOWN'\] with the row scale word"):
        M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    bad = instrs.clone()
    bad[int(scaled.nonzero().flatten()[0]), W_ROW0] = T
    with pytest.raises(ValueError, match="outside ROW_SCALE's 512 token rows"):
        M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)


def test_check_plan_norm_fold_unsplit():
    """PlanConfig.norm_fold=2 without split-K (split_k 1): every QKV_ROPE / GATE_UP tile reads h
    and scales its rows after its epilogue wait (A_EPI_WAIT), every norm is a row-scale one; the
    SPLITK allocation exists for ROW_SCALE alone (mk.plan.splitk_shape) and check_plan accepts the
    stream with it. Refused: no workspace, an epilogue wait on an O_PROJ tile, one on a counter
    past the megakernel's, a split tile with one."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.instructions import _common as mc
    from mk.instructions import rows as rw
    from mk.instructions.base import Buf
    from mk.ir import W_OPCODE, Op
    from mk.plan import row_scale_rows
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(1, norm_fold=2)
    ops = instrs[:, W_OPCODE]
    tiles = ((ops == int(Op.QKV_ROPE)) | (ops == int(Op.GATE_UP)))
    assert (instrs[tiles, mc.A_EPI_WAIT] > 0).all()
    assert (instrs[ops == int(Op.RMSNORM), rw.A_DST] == int(Buf.ROW_SCALE)).all()
    assert sk_shape == (row_scale_rows(T, sk_shape[1]), sk_shape[1])
    M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    with pytest.raises(ValueError, match="ROW_SCALE lies in the SPLITK workspace"):
        M.check_plan(instrs, nbuf, T, H, 1 << 20, **kw)
    i = int(tiles.nonzero().flatten()[0])
    no_norm = instrs[ops != int(Op.RMSNORM)]      # the tiles' own refusal, no norm before them
    with pytest.raises(ValueError, match="tile with an epilogue wait"):
        M.check_plan(no_norm, nbuf, T, H, 1 << 20, **kw)
    o = int((ops == int(Op.O_PROJ)).nonzero().flatten()[0])
    bad = instrs.clone()
    bad[o, mc.A_EPI_WAIT], bad[o, mc.A_EPI_TARGET] = instrs[i, mc.A_EPI_WAIT], 1
    with pytest.raises(ValueError, match=r"\['O_PROJ'\] tiles with an epilogue wait"):
        M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    bad = instrs.clone()
    bad[i, mc.A_EPI_WAIT] = (1 << 20) + 1          # counter 1 << 20: one past the last
    with pytest.raises(ValueError, match="plan uses counter"):
        M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    bad = instrs.clone()
    bad[i, mc.A_NSPLIT] = 2
    with pytest.raises(ValueError, match="split GEMM tile with an epilogue wait"):
        M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)


# ------------------------------------------------------------------------- numeric tunables
# Compile-time numeric tunables (on since session 4 / 33), at the value that turns their gain off:
# their other values are kept for tuning, so they still have to compile.
TUNABLES_OFF = {"MK_ABORT_POLL_AFTER_NS": "0", "MK_SPLITS_IN_FLIGHT": "1"}


def test_numeric_tunables_off_compile_without_spills(tmp_path):
    """MK_ABORT_POLL_AFTER_NS (page waits read the abort word only after 2000 ns by default; 0 =
    on every poll) and MK_SPLITS_IN_FLIGHT (SPLITK_REDUCE's and the folded RMSNORM's partial
    loads of 4 splits issued together by default; 1 = a split per round trip) are tunables, read
    at import, so each variant compiles in a process of its own: the all-opcode M64 variant with
    split-K and both at TUNABLES_OFF's values compiles, 0 spills, no call; the modules read them
    as set; and its PTX differs from the default's (the values still change the kernel)."""
    import subprocess
    import sys
    code = (
        "import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n"
        "import _compile_gate, mk.megakernel as M\n"
        "from mk.instructions import _rows_kernel as rk, _attention_kernel as ak\n"
        "from mk.instructions import _splitk_kernel as sk\n"
        "on = sys.argv[1] == '1'\n"
        "got = (rk.ABORT_POLL_AFTER_NS > 0, rk.SPLITS_IN_FLIGHT > 1)\n"
        "assert got == (on,) * 2, got\n"
        "comp = M.compile_fake(gemm=M.class_slots(64), attn_page_size=16, gather=True, splitk=True)\n"
        "open(sys.argv[2], 'w').write(comp.__ptx__)\n") % (os.path.dirname(__file__), ROOT)
    ptx = {}
    for flag in ("1", "0"):             # 1: the defaults (unset), 0: TUNABLES_OFF's values
        out = tmp_path / f"sw{flag}.ptx"
        env = {k: v for k, v in os.environ.items() if k not in TUNABLES_OFF}
        if flag == "0":
            env.update(TUNABLES_OFF)
        r = subprocess.run([sys.executable, "-c", code, flag, str(out)], env=env,
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        ptx[flag] = out.read_text()
    assert ptx["0"] != ptx["1"], "the tunables no longer change the PTX"
    assert not re.search(r"^\s*call", ptx["0"], flags=re.M), "function calls in the kernel"
    rep = ptxas_report(ptx["0"], str(tmp_path / "sw0"))
    assert_clean(rep)


def _variant_cache_path(tmp_path, env: dict, m_class: int, slots: str):
    """Where variant_ptx keeps a variant's PTX for the rest of the test run: the same switches,
    class and slots compile to the same PTX, and a compile is ~2.5 min of CI's CPU (the default
    M64 variant is asked for by several tests). Under the run's pytest-N directory, which the
    pytest-xdist workers of a run share and pytest's retention of old runs removes."""
    import hashlib
    # (the DSL's dump directory is per process: not a switch)
    switches = sorted((k, v) for k, v in env.items()
                      if k.startswith(("MK_", "CUTE_DSL")) and not k.endswith("_DIR"))
    key = hashlib.sha256(repr((switches, m_class, slots)).encode()).hexdigest()[:20]
    root = next((p for p in tmp_path.parents if re.fullmatch(r"pytest-\d+", p.name)),
                tmp_path.parent)
    return root / "variant_ptx_cache" / f"{key}.ptx"


def variant_ptx(tmp_path, name: str, env: dict, check: str, m_class: int = 64,
                slots: str = "") -> str:
    """The PTX of the all-opcode variant of M class m_class (default M64) with split-K, compiled
    in a process of its own (compile-time switches and MK_TILES are read at import) with the
    environment updated by env; `check`: a Python line run there after `import mk.megakernel as
    M` (the modules saw the switch); slots: more M.class_slots arguments (", row_parts=True").
    A variant already compiled in this test run with the same environment is read back from
    _variant_cache_path (its check still runs, in a process that only imports)."""
    import subprocess
    import sys
    # line info only where asked for: its .loc lines split the instruction sequences the PTX
    # checks look for (an in-process bench/code_size.py call leaves CUTE_DSL_LINEINFO=1 behind)
    inherited = {k: v for k, v in os.environ.items() if k != "CUTE_DSL_LINEINFO"}
    full_env = dict(inherited, **env)
    cached = _variant_cache_path(tmp_path, full_env, m_class, slots)
    compile_line = ("comp = M.compile_fake(gemm=M.class_slots(%d%s), attn_page_size=16, "
                    "gather=True, splitk=True)\n"
                    "open(sys.argv[1], 'w').write(comp.__ptx__)\n") % (m_class, slots)
    code = (
        "import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n"
        "import _compile_gate, mk.megakernel as M\n"
        "from mk.instructions import _rows_kernel as rk\n"
        "%s\n") % (os.path.dirname(__file__), ROOT, check)
    out = tmp_path / f"{name}.ptx"
    hit = cached.is_file()
    r = subprocess.run([sys.executable, "-c", code + ("" if hit else compile_line), str(out)],
                       env=full_env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    if hit:
        ptx = cached.read_text()
        out.write_text(ptx)
        return ptx
    ptx = out.read_text()
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(ptx)
    os.replace(partial, cached)            # whole files only, whichever worker writes last
    return ptx


def assert_clean_variant(tmp_path, name: str, ptx: str) -> int:
    """A variant's PTX has no function call and ptxas compiles it without spills, stack or a
    BAD_PTXAS warning (its report under tmp_path / name); returns the registers it used."""
    assert not re.search(r"^\s*call", ptx, flags=re.M), f"function calls in the kernel ({name})"
    return assert_clean(ptxas_report(ptx, str(tmp_path / name)))


def assert_switch_adds_waits(tmp_path, name: str, var: str, check: str) -> None:
    """A controller switch's PTX (the all-opcode M64 variant with split-K, var=0 and var=1, each
    in a process of its own; check: a line with {on} run there after the import): on, it
    compiles with 0 spills and no call and has more mbarrier waits than off."""
    ptx = {flag: variant_ptx(tmp_path, f"{name}{flag}", {var: flag}, check.format(on=flag == "1"))
           for flag in ("0", "1")}
    waits = {f: len(re.findall(r"mbarrier\.try_wait", p)) for f, p in ptx.items()}
    assert waits["1"] > waits["0"], waits
    assert not re.search(r"^\s*call", ptx["1"], flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx["1"], str(tmp_path / f"{name}1")))


def test_instruction_ring_depth_variant_compiles_without_spills(tmp_path):
    """MK_NISLOTS (the controller's look-ahead, 4 by default; compile-time, read at import, so in
    a process of its own): the all-opcode M64 variant with split-K compiles with 0 spills and no
    call at depth 3 (slot and phase by a division that is not a shift; 2 and 3 were checked on
    the GPU in session 13)."""
    ptx = variant_ptx(tmp_path, "slots3", {"MK_NISLOTS": "3"}, "assert M.NISLOTS == 3")
    assert_clean_variant(tmp_path, "slots3", ptx)


def test_claim_after_loads_variant_compiles_without_spills(tmp_path):
    """Claim after loads (the controller claims the next ticket once the loader is done with the
    previous slot's instruction; a compile-time variant, on for the M classes above 64, forced
    by MK_CLAIM_AFTER_LOADS, read at import, so in a process of its own): the all-opcode M64
    variant with split-K compiles with 0 spills and no call with it, and has more mbarrier
    waits than without (the controller's `lnext` wait)."""
    assert_switch_adds_waits(tmp_path, "claim", "MK_CLAIM_AFTER_LOADS",
                             "assert M.claim_after_loads_for(64) == {on}")


def test_claim_after_loads_policy_by_m_class(monkeypatch):
    """The claim policy per variant: off for the M <= 64 class (B=1 / 16 lost 2% with it), on
    above (B=1024 -17.9%); MK_CLAIM_AFTER_LOADS forces it either way (read at import: patched
    here), any other value is refused at import with the variable named."""
    import subprocess
    import sys

    import mk.megakernel as M
    ms = (None, 1, 64, 65, 256, 1024, 4096)
    want = {"": [False, False, False, True, True, True, True], "0": [False] * 7, "1": [True] * 7}
    for val, out in want.items():
        monkeypatch.setattr(M, "CLAIM_AFTER_LOADS_ENV", val)
        assert [M.claim_after_loads_for(m) for m in ms] == out, val
    r = subprocess.run([sys.executable, "-c", "import mk.megakernel"], cwd=ROOT,
                       env=dict(os.environ, MK_CLAIM_AFTER_LOADS="yes"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and "MK_CLAIM_AFTER_LOADS='yes'" in r.stderr, r.stderr[-2000:]


def test_norm_row_batch_variant_compiles_without_spills(tmp_path):
    """MK_NORM_ROW_BATCH (rows of an RMSNORM whose loads are in flight together; 2 by default,
    compile-time, read at import, so in a process of its own): the all-opcode M64 variant with
    split-K compiles with 0 spills and no call with the row-by-row body (1, session 13's), and
    its RMSNORM then issues half the row loads per group (fewer 16-byte global loads in the
    PTX than the default's)."""
    ptx1 = variant_ptx(tmp_path, "normrow1", {"MK_NORM_ROW_BATCH": "1"},
                       "assert rk.NORM_ROW_BATCH == 1")
    assert_clean_variant(tmp_path, "normrow1", ptx1)
    ptx2 = variant_ptx(tmp_path, "normrow2", {}, "assert rk.NORM_ROW_BATCH == 2")
    loads = [len(re.findall(r"ld\.global[\w.]*\.v4\.(?:b32|u32|f32)", p)) for p in (ptx1, ptx2)]
    assert loads[1] > loads[0], loads


def test_norm_row_batch_big_applies_to_the_classes_of_128_row_tiles(tmp_path):
    """MK_NORM_ROW_BATCH_BIG (the row group of the variants whose GEMM tiles have 128 rows: the
    M classes above 64) leaves the M64 variant's group at MK_NORM_ROW_BATCH and sets the others';
    the 1024 class compiles with groups of 4 without spills, its RMSNORM issuing more 16-byte
    row loads than the default's. (Groups of 8 compiled clean there until the watchdog became
    the default in session 53; with it they spill 12 / 68 bytes in the 1024 class, 0 in 256.)"""
    check = ("assert rk.NORM_ROW_BATCH == 2 and rk.NORM_ROW_BATCH_BIG == {big}\n"
             "assert M.norm_row_batch(M.class_slots(64)) == 2\n"
             "assert all(M.norm_row_batch(M.class_slots(m)) == {big} for m in (256, 1024, 4096))\n"
             "assert M.norm_row_batch(()) == 1")
    big4 = variant_ptx(tmp_path, "normbig4", {"MK_NORM_ROW_BATCH_BIG": "4"}, check.format(big=4),
                       m_class=1024)
    assert_clean_variant(tmp_path, "normbig4", big4)
    base = variant_ptx(tmp_path, "normbig2", {}, check.format(big=2), m_class=1024)
    loads = [len(re.findall(r"ld\.global[\w.]*\.v4\.(?:b32|u32|f32)", p)) for p in (base, big4)]
    assert loads[1] > loads[0], loads


def test_norm_row_batch_out_of_range_is_refused():
    """MK_NORM_ROW_BATCH or MK_NORM_ROW_BATCH_BIG outside 1 / 2 / 4 / 8 is refused at import with
    the variable named."""
    import subprocess
    import sys
    for var in ("MK_NORM_ROW_BATCH", "MK_NORM_ROW_BATCH_BIG"):
        r = subprocess.run([sys.executable, "-c", "import mk.instructions._rows_kernel"],
                           cwd=ROOT, env=dict(os.environ, **{var: "3"}), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode != 0 and f"{var}=3" in r.stderr, r.stderr[-2000:]


def test_gather_on_the_consumers_compiles_without_spills(tmp_path):
    """MK_GATHER_ROLE=consumers (EMBED on both consumer warpgroups, gat.UNROLL_CONSUMERS vectors a
    thread in flight, on RMSNORM's page protocol; LM_NORM through RMSNORM's own body with its
    rows gathered, rk.rmsnorm_consume's `gather`): the all-opcode M64 variant and the class
    above 1024 tokens (session 48's build, with LM_NORM's own body on the consumers, spilled 16
    bytes there) compile with split-K with 0 spills and no call, and LM_NORM's own body is not
    compiled in (one rsqrt fewer than the storer's build: its norm is RMSNORM's)."""
    check = ("from mk.instructions import _gather_kernel as gat\n"
             "assert gat.GATHER_ROLE == 'consumers' and gat.UNROLL_CONSUMERS > gat.UNROLL")
    ptx = variant_ptx(tmp_path, "gathercons", {"MK_GATHER_ROLE": "consumers"}, check)
    assert_clean_variant(tmp_path, "gathercons", ptx)
    big = variant_ptx(tmp_path, "gathercons4096", {"MK_GATHER_ROLE": "consumers"}, check,
                      m_class=4096)
    assert_clean_variant(tmp_path, "gathercons4096", big)
    base = variant_ptx(tmp_path, "gatherstorer", {}, "")
    rsqrt = [len(re.findall(r"\brsqrt\.", p)) for p in (base, ptx)]
    assert rsqrt[1] == rsqrt[0] - 1, rsqrt


def test_gather_role_out_of_range_is_refused():
    """MK_GATHER_ROLE other than storer / consumers is refused at import with the value named."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "import mk.instructions._gather_kernel"],
                       cwd=ROOT, env=dict(os.environ, MK_GATHER_ROLE="loader"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "MK_GATHER_ROLE='loader'" in r.stderr, r.stderr[-2000:]


def test_instruction_ring_depth_out_of_range_is_refused():
    """MK_NISLOTS outside 2 .. 8 is refused at import with the variable named."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", "import mk.megakernel"], cwd=ROOT,
                       env=dict(os.environ, MK_NISLOTS="1"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "MK_NISLOTS=1" in r.stderr, r.stderr[-2000:]


def test_l2_hints_variant_compiles_without_spills(tmp_path):
    """MK_L2_HINTS=weights,kv (the default; compile-time, read at import, so in a process of its
    own): the GEMM weight loads carry the evict-first L2 policy and the K/V loads a policy chosen
    per unit (evict first for decode, normal otherwise); the all-opcode M64 variant with split-K
    compiles with 0 spills and no call. With MK_L2_HINTS=none no TMA load carries either policy
    (every load keeps policy 0, the build before session 11). With "kv,acts" (session 40) the
    GEMM activation (A) loads carry evict-last and the weight loads none."""
    from mk.instructions import _rows_kernel as rk
    want = {"none": set(), "weights,kv": {"weights", "kv"}, "kv,acts": {"kv", "acts"}}
    ptx = {h: variant_ptx(tmp_path, f"l2{h.replace(',', '_')}", {"MK_L2_HINTS": h},
                          f"assert rk.L2_HINTS == {want[h]!r}, rk.L2_HINTS")
           for h in want}

    def policies(p: str) -> dict:
        """TMA loads per policy operand: the constant it was set from, else the register."""
        movs = dict(re.findall(r"mov\.b64 \t(%rd\d+), (\d+);", p))
        sels = {r: (a, b) for r, a, b in re.findall(r"selp\.b64 \t(%rd\d+), (\d+), (\d+),", p)}
        n: dict = {}
        for reg in re.findall(r"cp\.async\.bulk\.tensor[^;]*\.L2::cache_hint [^;]*, (%rd\d+);", p):
            key = movs.get(reg) or sels.get(reg) or reg
            n[key] = n.get(key, 0) + 1
        return n

    first, normal = str(rk.L2_EVICT_FIRST), str(rk.L2_EVICT_NORMAL)
    base, hinted = policies(ptx["none"]), policies(ptx["weights,kv"])
    assert set(base) == {"0"}, base
    assert hinted.get(first, 0) > 0, hinted                   # weight (B) pages
    assert hinted.get((first, normal), 0) > 0, hinted         # K/V pages: decode or not
    assert sum(hinted.values()) == sum(base.values())
    acts = policies(ptx["kv,acts"])
    assert acts.get(str(rk.L2_EVICT_LAST), 0) > 0 and acts.get(first, 0) == 0, acts
    assert hinted.get(str(rk.L2_EVICT_LAST), 0) == 0, hinted
    assert not re.search(r"^\s*call", ptx["weights,kv"], flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx["weights,kv"], str(tmp_path / "l2hints")))


def test_all_opcode_journal_variant_compiles_without_spills(tmp_path):
    """The variant `launch/bench.py --journal` runs (all opcodes, split-K, journal): 0 spills, no
    call, and ATTENTION's clocks in it (two timer reads around each of the loader's, consumers'
    and storer's K/V page waits: 7 sites; the consumers' two wgmma waits and their online
    softmax: 3 more) beyond the plain journal stamps; each GEMM slot's consumers add two sites
    (operand waits, wgmma waits) and a stamp (epilogue pages full)."""
    import mk.megakernel as M
    comp = M.compile_fake(journal=True, gemm=M.class_slots(64), attn_page_size=16, gather=True,
                          splitk=True)
    ptx = comp.__ptx__
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx, str(tmp_path / "journal")))
    # the journal's words 20..24 are written (the clocks' totals)
    assert M.J_LOAD_WAIT < M.JOURNAL_WORDS and M.J_ATTN_SOFTMAX < M.JOURNAL_WORDS
    n_gemm = len(M.class_slots(64))
    assert len(re.findall(r"globaltimer", ptx)) >= 20 + 5 * n_gemm + len(re.findall(
        r"globaltimer", M.compile_fake(journal=True, gemm=(), attn_page_size=0).__ptx__))


def test_m64_tiles_at_class_256_compile_with_split_k(tmp_path):
    """The M <= 256 class on the 64-row tiles (the default before session 7; scripts/gpu_next.sh
    `tiles` times them against the 128-row default through MK_TILES): the all-opcode M256
    variant compiles with them and their split-K partial stores, 0 spills, no call."""
    env = {"MK_TILES": "QKV_ROPE@256=m64n256,O_PROJ@256=m64n256,GATE_UP@256=gu_m64,"
                       "DOWN@256=m64n256"}
    ptx = variant_ptx(tmp_path, "m64", env, "assert {s.tile for s in M.class_slots(256)} >= "
                      "{'m64n256', 'gu_m64'}", m_class=256)
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx, str(tmp_path / "m64")))


@pytest.mark.parametrize("cls,tile", [(64, "gu_m64n112"), (256, "gu_m128n56"),
                                      (1024, "gu_m128n112")])
def test_112_row_gate_up_tiles_compile_in_the_step_variant(tmp_path, cls, tile):
    """GATE_UP on the 112-row B page tiles (session 19's A/B candidates, MK_TILES): the all-opcode
    variant of their class compiles with them and their split-K partial stores, 0 spills, no
    call."""
    ptx = variant_ptx(tmp_path, tile, {"MK_TILES": f"GATE_UP@{cls}={tile}"},
                      f"assert {tile!r} in {{s.tile for s in M.class_slots({cls})}}", m_class=cls)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n(56|112)k16", ptx)
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx, str(tmp_path / tile)))


# ------------------------------------------------------------------------------------ L2 prefetch
def test_l2_prefetch_variant_compiles_without_spills(tmp_path):
    """Megakernel(l2_prefetch=True): the loader's L2_PREFETCH body (bulk L2 prefetches over the
    stacked weights of each prefetchable GEMM slot) in the all-opcode M64 variant with split-K;
    0 spills, no call. (Without it, nothing changes: the default variants' PTX has none.)"""
    import mk.megakernel as M
    comp = M.compile_fake(gemm=M.class_slots(64), attn_page_size=16, gather=True, splitk=True,
                          l2_prefetch=True)
    ptx = comp.__ptx__
    # two paths (whole rows / K columns of each row) per prefetchable weight
    assert ptx.count("cp.async.bulk.prefetch.L2") == 2 * len(M.PREFETCH_OPS), \
        ptx.count("cp.async.bulk.prefetch.L2")
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx, str(tmp_path / "l2")))


def test_check_plan_l2_prefetch():
    """Plans with L2_PREFETCH (PlanConfig.l2_prefetch_mib) pass check_plan with the variant that
    has the body and are refused without it; bad words are refused with the reason."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.instructions import prefetch as pf
    from mk.ir import W_COL0, W_COLS, W_LAYER, W_OPCODE, Op
    instrs, (nbuf, T, H), kw, sk_shape = _tiny_step_plan(0, tokens=(1, 1, 7), l2_prefetch_mib=4)
    assert kw.pop("l2_prefetch") is True
    pre = (instrs[:, W_OPCODE] == M.OP_L2_PREFETCH).nonzero().flatten()
    assert len(pre) > 0
    M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, l2_prefetch=True, **kw)
    with pytest.raises(NotImplementedError, match="l2_prefetch=True"):
        M.check_plan(instrs, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, **kw)
    i = int(pre[0])

    def refused(word, value, match):
        bad = instrs.clone()
        bad[i, word] = value
        with pytest.raises(ValueError, match=match):
            M.check_plan(bad, nbuf, T, H, 1 << 20, splitk_shape=sk_shape, l2_prefetch=True, **kw)
    refused(pf.A_WOP, int(Op.LM_HEAD), "L2_PREFETCH of the weights of opcode")
    refused(W_COLS, 1 << 20, "outside the")
    refused(W_COL0, -1, "outside the")
    refused(pf.A_K0, 3, "granules")
    refused(pf.A_K1, 1 << 20, "K columns")
    refused(W_LAYER, 99, "layer beyond")


def test_gemm_mainloop_switches_off_compile_without_spills(tmp_path):
    """MK_GEMM_WIDE=0 (two N = 128 wgmma chains per two-B-page tile) and MK_GEMM_STAGE_FULL=page
    (a `full` barrier wait per operand page), the build before session 23 and the A/B knobs of
    the defaults (one N = 256 chain, one barrier per stage; bench/GEMM_NOTES.md session 23):
    compile-time, read at import, so in a process of its own. The all-opcode variant of the 1024
    class (O_PROJ / DOWN on m128n256) with split-K compiles with 0 spills and no call, without
    the m64n256 wgmma the default has there (tests/test_gemm_compile.py)."""
    from mk.instructions import _gemm_kernel as gk
    assert gk.WIDE and gk.ONE_FULL, "the defaults changed: update this test"
    off = variant_ptx(tmp_path, "mainloop_off", {"MK_GEMM_WIDE": "0", "MK_GEMM_STAGE_FULL": "page"},
                      "from mk.instructions import _gemm_kernel as gk\n"
                      "assert not gk.WIDE and not gk.ONE_FULL", m_class=1024)
    assert "m64n256k16" not in off and "m64n128k16" in off
    assert not re.search(r"^\s*call", off, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(off, str(tmp_path / "mainloop_off")))


# the trace-time check lines of a GEMM epilogue variant start with these
GK = "from mk.instructions import _gemm_kernel as gk\nT = gk.TILES\n"


def epilogue_counts(ptx: str) -> tuple:
    """(bulk-tensor stores, their read waits, stmatrix.x4, ldmatrix.x4) in a variant's PTX."""
    return tuple(len(re.findall(rx, ptx)) for rx in (
        r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", r"cp\.async\.bulk\.wait_group\.read",
        r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16",
        r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16"))


def assert_variant_clean(ptx: str, tmp_path, name: str) -> None:
    """No function call in the kernel; ptxas: 0 spills, no stack frame."""
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx, str(tmp_path / name)))


def test_gemm_epilogue_default_compiles_without_spills(tmp_path):
    """The GEMM epilogue (session 25's; its switches removed in session 63): in the all-opcode
    1024-class variant with split-K, O_PROJ's m128n256 tiles (RESIDUAL; DOWN's run
    through the same bodies: MK_GEMM_TWIN, the default since session 44) stage their output by
    stmatrix.x4 after an ldmatrix.x4 of the residual (two chains of eight column groups: 16 + 16)
    and leave through TMA stores (one per 16 KB page, four) with a write wait before the signal;
    since session 28 their epilogue pages are handed over chain by chain
    (gk.chain_pages): one read wait for the first chain's pages, then one per page of
    the last chain (1 + 2). GATE_UP's SiLU tiles keep the pair stores and the copy. 0 spills, no
    call."""
    ptx = variant_ptx(tmp_path, "epi_default", {}, GK +
                      "assert gk.tma_stores(gk.EPI_RESIDUAL, T['m128n256'])\n"
                      "assert not gk.tma_stores(gk.EPI_SILU_MUL, T['gu_m128'])\n"
                      "assert not gk.tma_stores(gk.EPI_ROPE, T['m128n128'])\n"
                      "assert gk.stsm_chain_ok(gk.EPI_RESIDUAL, 32)\n"
                      "assert not gk.stsm_chain_ok(gk.EPI_SILU_MUL, 28)\n"
                      "assert not gk.stsm_chain_ok(gk.EPI_RESIDUAL, 30)\n"
                      "assert gk.chain_pages(T['m128n256'], gk.EPI_RESIDUAL) == 2\n"
                      "assert gk.chain_pages(T['m128n128'], gk.EPI_RESIDUAL) == 0\n"
                      "assert gk.chain_pages(T['gu_m128'], gk.EPI_SILU_MUL) == 0\n"
                      "import mk.megakernel as M\nassert M.GEMM_TWIN", m_class=1024)
    assert epilogue_counts(ptx) == (4, 3, 16, 16)
    assert re.search(r"cp\.async\.bulk\.wait_group\s+0;", ptx)
    assert "add.rn.bf16x2" in ptx
    assert_variant_clean(ptx, tmp_path, "epi_default")


def test_synccheck_probe_compiles():
    """bench/probes/synccheck_mbarrier_probe.py (session 32: which mbarrier patterns synccheck
    reports as "Missing wait"; its H200 log: bench/results/synccheck_probe_2026-12-04_s32.log):
    every variant compiles, and the fixes add exactly their waits: selfwait and conswait wait on
    the B page's `full` that stagefull leaves unobserved (gemm's own_phase_seen is selfwait), and
    selftest / constest test it there instead (session 38 on the H200: both still Missing wait,
    so gemm's consumer_test, which was constest, was removed)."""
    probe = probe_module("synccheck_mbarrier_probe")
    waits = {v: len(re.findall(r"mbarrier\.try_wait", probe.compile_ptx(v)))
             for v in ("stagefull", "selfwait", "conswait")}
    assert waits["selfwait"] > waits["stagefull"] and waits["conswait"] > waits["stagefull"], waits
    # session 37's selftest / constest: stagefull plus one test_wait on that `full` each
    tests = {v: len(re.findall(r"mbarrier\.test_wait", probe.compile_ptx(v)))
             for v in ("stagefull", "selftest", "constest")}
    assert tests == {"stagefull": 0, "selftest": 1, "constest": 1}, tests
    assert set(probe.VARIANTS) >= {"ring", "skipwait", "double", "twice"}
    for v in ("ring", "skipwait", "double", "twice"):
        assert re.search(r"mbarrier\.arrive", probe.compile_ptx(v)), v


def test_signal_is_a_release_red_without_a_fence(tmp_path):
    """The storer's signal after an instruction's stores is red.release.gpu alone (session 34;
    the fence.acq_rel.gpu before it cost 3.4% at B=1 and was removed in session 63): the default
    M64 variant with split-K (compiled once per run, variant_ptx) has the release red and no
    fence.acq_rel in front of it."""
    fenced_release = r"fence\.acq_rel\.gpu;\s*\n(?:\s*[^\n]*\n){0,6}?\s*red\.release\.gpu"
    ptx = variant_ptx(tmp_path, "sig_red", {}, "")
    assert re.search(r"red\.release\.gpu", ptx), "no release red"
    assert not re.search(fenced_release, ptx), "a fence.acq_rel before the release red"


def test_swap_split_variant_mirrors_its_barriers_without_spills(tmp_path):
    """MK_ATTN_SWAP_SPLIT=1 (ak.SWAP_SPLIT, session 35, off): a lone decode unit's key blocks over
    both warpgroups, merged at the end. It compiles (M64 with split-K) with 0 spills and no call;
    each warpgroup's own named barrier (5 and 6, 128 threads) is synced at as many places as the
    other's, and at more than in the default build (the key blocks a warpgroup does not own
    mirror the owner's syncs); the merge adds its exp2s (merge_factors)."""
    check = "import mk.instructions._attention_kernel as ak; assert ak.SWAP_SPLIT == {on}"
    ptx = {on: variant_ptx(tmp_path, f"swsplit_{on}", {"MK_ATTN_SWAP_SPLIT": "1" if on else "0"},
                           check.format(on=on))
           for on in (False, True)}

    def wg_syncs(p):
        return [len(re.findall(rf"bar\.sync\s+{b},\s*128;", p)) for b in (5, 6)]

    off, on = wg_syncs(ptx[False]), wg_syncs(ptx[True])
    assert on[0] == on[1] > off[0] == off[1], (off, on)
    exp2 = {k: len(re.findall(r"ex2\.approx", p)) for k, p in ptx.items()}
    assert exp2[True] > exp2[False], exp2
    assert not re.search(r"^\s*call", ptx[True], flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx[True], str(tmp_path / "swsplit_1")))


def test_gemm_ktrace_variant_compiles_without_spills(tmp_path):
    """MK_GEMM_KTRACE=N (the GEMM K-step trace, journal variant only; bench/GEMM_NOTES.md session
    39): the journal variant `launch/bench.py --journal` runs, with each GEMM slot's consumers and
    loader stamping the SM clock (clock64) six times a K step into journal rows of 32 + 6 N words,
    compiles with 0 spills and no call; without the journal nothing of it is compiled in."""
    import subprocess
    import sys
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "import mk.megakernel as M\n"
        "from mk.instructions import _gemm_kernel as gk\n"
        "assert gk.KTRACE == 16 and M.JOURNAL_WORDS == 32 + 6 * 16, M.JOURNAL_WORDS\n"
        "for j in (True, False):\n"
        "    comp = M.compile_fake(journal=j, gemm=M.class_slots(64), attn_page_size=16, "
        "gather=True, splitk=True)\n"
        "    open(sys.argv[1] + str(j), 'w').write(comp.__ptx__)\n") % ROOT
    out = tmp_path / "kt.ptx"
    r = subprocess.run([sys.executable, "-c", code, str(out)],
                       env=dict(os.environ, MK_GEMM_KTRACE="16"), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    ptx, plain = (tmp_path / "kt.ptxTrue").read_text(), (tmp_path / "kt.ptxFalse").read_text()
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx, str(tmp_path / "kt")))
    import mk.megakernel as M
    n_bodies = sum(s.twin_of < 0 for s in M.class_slots(64))     # a twin runs its host's
    assert len(re.findall(r"%clock64", ptx)) >= 6 * n_bodies
    assert "%clock64" not in plain
    r = subprocess.run([sys.executable, "-c", "import mk.megakernel"], cwd=ROOT,
                       env=dict(os.environ, MK_GEMM_KTRACE="999"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode != 0 and "MK_GEMM_KTRACE" in r.stderr


def ptx_counts(ptx: dict, pattern: str) -> dict:
    """Matches of pattern in each variant's PTX ({name: text} -> {name: count})."""
    return {name: len(re.findall(pattern, text)) for name, text in ptx.items()}


def test_wait_slim_probe_drops_the_waits_slow_paths_without_spills(tmp_path):
    """MK_WAIT_SLIM=1 (a probe of the waits' code size, bench/GEMM_NOTES.md session 42; never a
    default: its waits have no bound): the mbarrier waits compile to bare try_wait loops, so the
    all-opcode M64 variant with split-K has fewer globaltimer reads and error-record CASes than
    the build it probes (the inline bounded waits of sessions 1-52, MK_WAIT_WATCHDOG=0; slim
    turns the watchdog off), the same try_wait sites at most, and compiles with 0 spills and no
    call."""
    ptx = {flag: variant_ptx(tmp_path, f"slim{flag}",
                             {"MK_WAIT_SLIM": "1"} if flag == "1" else {"MK_WAIT_WATCHDOG": "0"},
                             f"assert rk.WAIT_SLIM == {flag == '1'} and not rk.WATCHDOG")
           for flag in ("0", "1")}

    timers, cases = ptx_counts(ptx, r"%globaltimer"), ptx_counts(ptx, r"atom\.[a-z.]*cas")
    assert timers["1"] < timers["0"] / 2, timers
    assert cases["1"] < cases["0"], cases
    waits = ptx_counts(ptx, r"mbarrier\.try_wait")
    assert 0 < waits["1"] <= waits["0"], waits
    assert not re.search(r"^\s*call", ptx["1"], flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx["1"], str(tmp_path / "slim1")))


def test_counter_poll_gate_compiles_clean_and_refuses_a_non_power_of_two(tmp_path):
    """MK_COUNTER_CHECK_EVERY=16 (session 51's question: is the counter waits' abort poll part of
    what makes the bounded waits slower than MK_WAIT_SLIM's? -0.5% at B=1 in session 52): the
    all-opcode M64 variant with split-K compiles with 0 spills and no call, the every-16th gate in
    it; 3 is refused at import."""
    import subprocess
    import sys
    knob, attr = "MK_COUNTER_CHECK_EVERY", "COUNTER_CHECK_EVERY"
    ptx = variant_ptx(tmp_path, attr, {knob: "16"}, f"assert rk.{attr} == 16")
    assert_clean_variant(tmp_path, attr, ptx)
    # the counter's gate: the failed-poll count's low 5 bits (2 x 16 - 1) against 1
    assert re.search(r"and\.b32\s+(%r\d+), %r\d+, 31;\s*setp\.ne\.b32\s+%p\d+, \1, 1;", ptx), \
        "no every-16th gate in the waits"
    r = subprocess.run([sys.executable, "-c", "import mk.instructions._rows_kernel"],
                       env=dict(os.environ, **{knob: "3"}, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and f"{knob}=3" in r.stderr, r.stderr[-2000:]


def test_watchdog_default_compiles_clean_with_its_bound_in_the_controller(tmp_path):
    """The watchdog (MK_WAIT_WATCHDOG, the default since session 53: the bound of the mbarrier
    waits moves to the controller's waits for a slot's roles; ~10% less SASS in the M64 class):
    the all-opcode M64 variant with split-K compiles with 0 spills and no call; its role page
    waits are try_waits with the suspend hint (rk.try_wait_suspend's inline PTX) and only the
    controller's few waits start a deadline, where MK_WAIT_WATCHDOG=0 (the inline bounded waits
    of sessions 1-52) starts one at every wait site; a value other than 0 / 1, or the watchdog
    beside MK_WAIT_SLIM, is refused at import."""
    import subprocess
    import sys
    deadline_start = (r"mbarrier\.try_wait[^\n]*\n\s*@%p\d+\s+bra\s+\S+;\n\s*mov\.u64\s+%rd\d+, "
                      r"%globaltimer")
    ptx = {flag: variant_ptx(tmp_path, f"watchdog{flag}",
                             {"MK_WAIT_WATCHDOG": "0"} if flag == "0" else {},
                             f"assert rk.WATCHDOG == {flag != '0'} and rk.WATCHED_HINT_NS == 20000")
           for flag in ("default", "0")}
    assert_clean_variant(tmp_path, "watchdog", ptx["default"])
    hinted = ptx_counts(ptx, r"mbarrier\.try_wait\.parity\.shared::cta\.b64 \S+, \[%r\d+\], "
                             r"%r\d+, 20000;")
    assert hinted["default"] >= 50 and hinted["0"] == 0, hinted
    # the controller's: iempty before a fill and the three after END, two compact waits each,
    # each matched twice (t0 after the first try_wait, the loop's clock after a failed one);
    # MK_WAIT_WATCHDOG=0 had 236 such matches in this class in session 52
    starts = ptx_counts(ptx, deadline_start)
    assert 1 <= starts["default"] <= 16 and starts["0"] >= 100, starts
    for env, text in (({"MK_WAIT_WATCHDOG": "2"}, "MK_WAIT_WATCHDOG=2"),
                      ({"MK_WAIT_WATCHDOG": "1", "MK_WAIT_SLIM": "1"}, "one wait policy")):
        r = subprocess.run([sys.executable, "-c", "import mk.instructions._rows_kernel"],
                           env=dict(os.environ, PYTHONPATH=ROOT, **env), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode != 0 and text in r.stderr, r.stderr[-2000:]


def test_a_waited_page_is_freed_after_every_waiting_warps_wait(tmp_path):
    """MK_WAITED_FREE (session 54): a page that several warps wait on is released only once
    each of them has waited. A page the storer warps only wait `done` on (a K/V page, a GEMM's
    last operand stage, a body's hand-off page) is freed by lane 0 of each storer warp after
    the warp's own wait (a bar.warp.sync, then an arrival of half the count, 128 of 256), no
    longer by thread 0 alone; a rows body's page gets half its release from warpgroup 1's warps
    after their rows_skip wait (32 each). "lead" (sessions 1-53) builds without those warp
    syncs. The default all-opcode M64 variant with split-K compiles clean; a value other than
    all / lead is refused at import."""
    import subprocess
    import sys
    ptx = {flag: variant_ptx(tmp_path, f"waitedfree_{flag}",
                             {} if flag == "all" else {"MK_WAITED_FREE": flag},
                             f"assert rk.WAITED_FREE == {flag!r}")
           for flag in ("all", "lead")}
    assert_clean_variant(tmp_path, "waitedfree", ptx["all"])
    syncs = ptx_counts(ptx, r"bar\.warp\.sync")
    assert syncs["lead"] == 0, syncs
    # the hand-offs of RMSNORM, SPLITK_REDUCE and LM_NORM, the K/V pages, each GEMM body's store
    halves = ptx_counts(ptx, r"bar\.warp\.sync\s+-1;(?:\n[^\n]*){0,4}\n\s*mov\.b32\s+%r\d+, "
                             r"128;\n\s*mbarrier\.arrive\.shared\.b64")
    assert halves["all"] >= 5 and halves["lead"] == 0, halves
    # rows_skip: a warp sync, then an arrival of 32 on `done` or (RESIDUAL_ADD's source page)
    # `empty`, one of each
    quarters = ptx_counts(ptx, r"mov\.b32\s+%r\d+, 32;\n\s*mbarrier\.arrive\.shared\.b64")
    assert quarters["all"] >= 2 and quarters["lead"] == 0, quarters
    assert syncs["all"] == halves["all"] + 2, (syncs, halves)
    r = subprocess.run([sys.executable, "-c", "import mk.instructions._rows_kernel"],
                       env=dict(os.environ, PYTHONPATH=ROOT, MK_WAITED_FREE="warps"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "MK_WAITED_FREE='warps'" in r.stderr, r.stderr[-2000:]


def test_backoff_env_sets_every_variants_default_and_refuses_out_of_range():
    """MK_BACKOFF_NS (the counter waits' nanosleep cap, for the whole-step A/B of gpu_next.sh
    backoff): the backend's Megakernel and the compile cache take it as their default; a value
    outside [20 ns, 1 ms] or not an integer is refused at import with the variable named."""
    import subprocess
    import sys
    probe = ("import inspect, mk.megakernel as M; "
             "print(M.DEFAULT_BACKOFF_NS, "
             "inspect.signature(M.Megakernel).parameters['backoff_ns'].default, "
             "inspect.signature(M.compile_fake).parameters['backoff_ns'].default)")

    def run(value=None):
        env = dict(os.environ, PYTHONPATH=ROOT)
        env.pop("MK_BACKOFF_NS", None)
        if value is not None:
            env["MK_BACKOFF_NS"] = value
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env=env, timeout=300)
    r = run()
    assert r.returncode == 0 and r.stdout.split() == ["200"] * 3, r.stderr[-2000:]
    r = run("50")
    assert r.returncode == 0 and r.stdout.split() == ["50"] * 3, r.stderr[-2000:]
    for bad in ("10", "2000000", "fast"):
        r = run(bad)
        assert r.returncode != 0 and f"MK_BACKOFF_NS={bad}" in r.stderr, r.stderr[-2000:]


def test_wait_slim_kinds_parse_and_refuse_a_kind_without_an_mbarrier_wait():
    """MK_WAIT_SLIM_KINDS (a probe: those kinds' mbarrier waits unbounded, the rest keep their
    record, so a starved bounded wait names where the slim build hangs): the kinds as given,
    every mbarrier wait kind under MK_WAIT_SLIM=1, none by default; a counter-wait kind (1, no
    mbarrier) or a word is refused at import with the variable named."""
    import subprocess
    import sys
    probe = ("import mk.instructions._rows_kernel as rk; "
             "print(sorted(rk.WAIT_SLIM_KINDS))")

    def kinds(**env):
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=ROOT, **env), timeout=300)
        return r.returncode, r.stdout.strip(), r.stderr
    assert kinds()[:2] == (0, "[]")
    assert kinds(MK_WAIT_SLIM_KINDS="4, 2")[:2] == (0, "[2, 4]")
    assert kinds(MK_WAIT_SLIM="1")[:2] == (0, "[2, 3, 4, 5, 8]")
    for bad in ("1", "full"):
        rc, _, err = kinds(MK_WAIT_SLIM_KINDS=bad)
        assert rc != 0 and f"MK_WAIT_SLIM_KINDS={bad}" in err, err[-2000:]


@pytest.mark.parametrize("kind,ticket,phase,sm,cta", [(2, 0, 0, 0, 0), (3, 155767, 1, 131, 131),
                                                     (7, 2**31 - 1, 1, 255, 2**15 - 1)])
def test_compact_wait_record_reads_back_as_the_error(kind, ticket, phase, sm, cta):
    """MK_WAIT_COMPACT's record (write_wait_error: one 64-bit CAS of ticket | kind << 32 | phase
    << 40 | sm << 41 | cta << 49 into state words 12-13) reads back through Megakernel.check's
    decoding as the same fields write_error's record would hold (counter -1, value 0, target the
    phase); a write_error record (its flag set) wins over it."""
    import numpy as np

    import mk.megakernel as M
    from mk.instructions import _rows_kernel as rk
    hi = kind | (phase << 8) | (sm << 9) | (cta << 17)
    packed = (hi << 32) | ticket
    words = [0] * rk.STATE_WORDS
    words[rk.S_ABORT] = 1
    # the state tensor is int32: the 64-bit word as the kernel's little-endian store leaves it
    lo32, hi32 = np.array([packed], dtype=np.uint64).view(np.int32).tolist()
    words[rk.S_ERR_PACKED], words[rk.S_ERR_PACKED + 1] = lo32, hi32
    e = M.error_of_state(words)
    assert (e.kind, e.instr, e.counter, e.value, e.target, e.sm, e.cta) == \
        (kind, ticket, -1, 0, phase, sm, cta)
    words[rk.S_ERR_FLAG], words[rk.S_ERR_KIND], words[rk.S_ERR_INSTR] = 1, rk.ERR_COUNTER_WAIT, 9
    e = M.error_of_state(words)
    assert (e.kind, e.instr) == (rk.ERR_COUNTER_WAIT, 9)


def test_hang_report_says_how_far_the_launch_got():
    """MegakernelHang's text (Megakernel.wait after hang_s): the CTAs that ended out of the grid
    and the queue head from the state words read meanwhile, an error record written meanwhile
    decoded as Megakernel.check would, and a plain statement when the read did not complete."""
    import mk.megakernel as M
    from mk.instructions import _rows_kernel as rk
    words = [0] * rk.STATE_WORDS
    words[rk.S_HEAD], words[rk.S_EXIT] = 136, 131
    text = M.hang_report(5.0, words, 132)
    assert text.startswith("megakernel still running after 5 s"), text
    assert "131 of 132 CTAs ended, queue head 136" in text and "recorded" not in text, text
    words[rk.S_ERR_FLAG], words[rk.S_ERR_KIND], words[rk.S_ERR_INSTR] = 1, rk.ERR_COUNTER_WAIT, 9
    text = M.hang_report(60.0, words, 132)
    assert "recorded meanwhile: " + str(M.error_of_state(words)) in text, text
    assert "could not be read" in M.hang_report(60.0, None, 132)


def test_compact_wait_variant_keeps_its_bound_without_spills(tmp_path):
    """MK_WAIT_COMPACT=1 (an option of the inline bounded waits, MK_WAIT_WATCHDOG=0): the waits
    keep their deadline (globaltimer reads) and abort poll, their timeout record is one 64-bit
    CAS (write_wait_error) instead of write_error's CAS, stores and fence; the all-opcode M64
    variant with split-K compiles with 0 spills and no call, and is smaller than
    MK_WAIT_COMPACT=0."""
    ptx = {flag: variant_ptx(tmp_path, f"compact{flag}",
                             dict({"MK_WAIT_COMPACT": "0"} if flag == "0" else {},
                                  MK_WAIT_WATCHDOG="0"),
                             f"assert rk.WAIT_COMPACT == {flag == '1'} and not rk.WATCHDOG")
           for flag in ("0", "1")}

    cas64 = ptx_counts(ptx, r"atom\.[a-z.]*cas\.b64")
    assert cas64["1"] > 0 == cas64["0"], cas64
    timers = ptx_counts(ptx, r"%globaltimer")
    assert timers["1"] > timers["0"] / 2, timers          # the deadlines stay
    fences = ptx_counts(ptx, r"membar|fence\.acq_rel")
    assert fences["1"] < fences["0"], fences
    assert len(ptx["1"]) < len(ptx["0"])
    assert not re.search(r"^\s*call", ptx["1"], flags=re.M), "function calls in the kernel"
    assert_clean(ptxas_report(ptx["1"], str(tmp_path / "compact1")))


def test_row_parts_variant_compiles_without_spills(tmp_path):
    """PlanConfig.norm_fold=4's variant (GemmSlot.row_parts: QKV_ROPE / GATE_UP tiles scaled
    from ROW_PART, O_PROJ / DOWN RESIDUAL epilogues and EMBED writing it) of the class above 1024
    tokens compiles with 0 spills and no call, and has the code (more butterfly shuffles and
    rsqrt than the same class's default build)."""
    ptx = variant_ptx(tmp_path, "rowparts4096", {}, "", m_class=4096, slots=", row_parts=True")
    assert_clean_variant(tmp_path, "rowparts4096", ptx)
    base = variant_ptx(tmp_path, "rowparts_base4096", {}, "", m_class=4096)
    for pat in (r"shfl\.sync\.bfly", r"\brsqrt\."):
        n = [len(re.findall(pat, p)) for p in (base, ptx)]
        assert n[1] > n[0], (pat, n)


def test_row_parts_m128_variant_compiles_without_spills(tmp_path):
    """The 65..128-token class (session 65: O_PROJ / DOWN on m128n64, 128 whole tiles, so its
    default plan writes ROW_PART) with ROW_PART compiles with 0 spills and no call (each
    warpgroup holds a 64-column part's 64 rows: no join of halves)."""
    ptx = variant_ptx(tmp_path, "rowparts128", {},
                      "assert {'m128n64', 'gu_m128n56'} <= {s.tile for s in M.class_slots(128)}",
                      m_class=128, slots=", row_parts=True")
    assert_clean_variant(tmp_path, "rowparts128", ptx)


def test_row_parts_m64_variant_joins_warpgroup_halves(tmp_path):
    """The M64 class with ROW_PART (norm_fold=4, its default plan since O_PROJ / DOWN run whole
    m64n64 tiles there, session 64): each warpgroup holds 32 of a 64-column part's columns, so
    the O_PROJ / DOWN epilogue joins the halves through shared memory after the consumers' named
    barrier (gk.join_warpgroup_halves). It compiles with 0 spills and no call, on m64n32 wgmmas,
    with more of that barrier than the class's build without ROW_PART."""
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import Op
    assert gk.choose_tile(Op.O_PROJ, 64).name == "m64n64", "the table changed: update this test"
    ptx = variant_ptx(tmp_path, "rowparts64", {}, "", m_class=64, slots=", row_parts=True")
    assert_clean_variant(tmp_path, "rowparts64", ptx)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16", ptx)
    base = variant_ptx(tmp_path, "rowparts_base64", {}, "", m_class=64)
    bar = r"bar\.sync\s+%d," % gk.BAR_CONSUMERS
    n = [len(re.findall(bar, p)) for p in (base, ptx)]
    assert n[1] > n[0], n
