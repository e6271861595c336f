"""Compile gate (CPU, CI) of the GEMM-tile bodies (mk/instructions/_gemm_kernel.py), each compiled
into the megakernel (mk/megakernel.py: rows family + the GEMM slot) once per (opcode, tile config)
of the tile table: the PTX holds wgmma.mma_async (with an async chain: wait_group 1 in the
mainloop), cp.async.bulk.tensor and setmaxnreg; no function calls; ptxas reports no spills, no
stack frame and no C7506/C7508/C7510, and the variant's setmaxnreg split fits the launch's
registers; where a disassembler exists, the SASS holds HGMMA. The splittable slots also compile
with split-K in (partial stores + SPLITK_REDUCE)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from _compile_gate import (assert_clean, assert_split_variant, dump_dir,  # noqa: F401
                           hgmma_loop, megakernel_sass,
                           ptxas_report)  # (env set first)

import cutlass  # noqa: E402  (after _compile_gate: CUTE_DSL_ARCH)
import cutlass.cute as cute  # noqa: E402
import cutlass.utils.hopper_helpers as sm90_utils  # noqa: E402
from cutlass import BFloat16, Float32  # noqa: E402

pytestmark = pytest.mark.compile

REQUIRED_PTX = {
    "wgmma.mma_async":
        r"wgmma\.mma_async\.sync\.aligned\.m64n(32|56|64|112|128|256)k16\.f32\.bf16\.bf16",
    "wgmma wait_group 1 (async chain)": r"wgmma\.wait_group\.sync\.aligned\s+1;",
    "cp.async.bulk.tensor": r"cp\.async\.bulk\.tensor",
    "setmaxnreg.inc": r"setmaxnreg\.inc",
    "setmaxnreg.dec": r"setmaxnreg\.dec",
    "release signal": r"red\.release\.gpu",
    "mbarrier try_wait": r"mbarrier\.try_wait",
}

# (opcode name, tile name, wgmma instructions per K-step in the PTX): the tile table's entries
# (O_PROJ / DOWN m64n256 left the table in session 7; the PAGE mode stays covered by QKV_ROPE's)
CASES = [
    ("O_PROJ", "m128n256", 8),
    ("O_PROJ", "m128n128", 4),     # the M <= 256 class since session 18
    ("O_PROJ", "m64n128", 4),      # the M <= 64 class until session 64
    ("O_PROJ", "m64n64", 4),       # the M <= 64 class since session 64: m64n32 per warpgroup
    ("O_PROJ", "m128n64", 4),      # the 65..128 class since session 65: m64n64 per warpgroup
    ("DOWN", "m128n256", 8),
    ("DOWN", "m128n128", 4),
    ("DOWN", "m64n128", 4),
    ("DOWN", "m64n64", 4),
    ("DOWN", "m128n64", 4),        # the 65..128 class since session 65: m64n64 per warpgroup
    ("GATE_UP", "gu_m128", 8),
    ("GATE_UP", "gu_m64", 8),
    ("GATE_UP", "gu_m128n64", 4),      # one B page of 64 gate + 64 up rows
    ("GATE_UP", "gu_m128n112", 8),     # 112-row B pages, wgmma N = 112 (session 19, A/B only)
    ("GATE_UP", "gu_m128n56", 4),      # one B page of 56 gate + 56 up rows
    ("GATE_UP", "gu_m64n112", 8),      # gu_m64 on 112-row pages: m64n56 per warpgroup
    ("LM_HEAD", "m128n256", 8),       # the M > 64 classes since session 27
    ("LM_HEAD", "m128n128", 4),       # the M <= 256 class in sessions 20-26
    ("LM_HEAD", "m64n128", 4),
    ("QKV_ROPE", "m128n128", 4),
    ("QKV_ROPE", "m64n256", 4),
]


def _table_cases():
    from mk.instructions import _gemm_kernel as gk
    return sorted({(op.name, name) for op, names in gk.TILE_TABLE.items() for name in names})


def _class_of(op, tile) -> int:
    """An M whose class picks `tile` for `op` (0: none does)."""
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import Op
    for m in (64, 256, 1024, 4096):
        if gk.choose_tile(Op[op], m).name == tile:
            return m
    return 0


def _slots(op, tile):
    """The megakernel's GEMM slot of `op` on `tile` (a tile outside the table: explicitly)."""
    import mk.megakernel as M
    from mk.ir import Op
    m = _class_of(op, tile)
    if m == 0:
        return (M.GemmSlot(int(Op[op]), tile, 0, 0),)
    return M.class_slots(m, [Op[op]])


def test_cases_cover_the_tile_table():
    pytest.importorskip("cutlass")
    have = {(o, t) for o, t, _ in CASES}
    missing = [c for c in _table_cases() if c not in have]
    assert not missing, f"tile table entries without a compile gate: {missing}"


def test_tile_table_fits_the_pool():
    pytest.importorskip("cutlass")
    from mk.instructions import _gemm_kernel as gk
    from mk.ir import Op
    for op, names in gk.TILE_TABLE.items():
        for name in names:
            cfg = gk.TILES[name]
            cfg.check(gk.out_bytes_of(gk.epi_of(op)), 13)
            assert cfg.gate_up == (op == Op.GATE_UP), (op, name)
    for m, want in ((64, "m64n64"), (65, "m128n64"), (128, "m128n64"), (129, "m128n128"),
                    (256, "m128n128"), (257, "m128n256"), (1024, "m128n256"),
                    (4096, "m128n256")):
        assert gk.choose_tile(Op.O_PROJ, m).name == want


def _sass_tool():
    from mk.cuda_tools import find_tool
    for t in ("cuobjdump", "nvdisasm"):
        p = find_tool(t)
        if p:
            return t, p
    return None, None


@pytest.mark.parametrize("op,tile,wgmma_per_k", CASES, ids=[f"{o}-{t}" for o, t, _ in CASES])
def test_gemm_body_compiles_for_sm90a(dump_dir, op, tile, wgmma_per_k):
    import mk.megakernel as M

    slots = _slots(op, tile)
    assert slots[0].tile == tile
    comp = M.compile_fake(gemm=slots)
    ptx = comp.__ptx__
    assert ptx, "no PTX kept"
    missing = [k for k, rx in REQUIRED_PTX.items() if not re.search(rx, ptx)]
    assert not missing, f"PTX lacks {missing}"
    n = len(re.findall(r"wgmma\.mma_async", ptx))
    if slots[0].cfg.wide:
        # one N = 256 chain over both B pages (gk.WIDE): half the wgmmas, each twice as wide
        wgmma_per_k //= 2
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16", ptx), "no m64n256k16"
    assert n == wgmma_per_k, f"{n} wgmma.mma_async in the PTX, expected {wgmma_per_k} per K-step"
    assert not re.search(r"^\s*call", ptx, flags=re.M), "function calls in the kernel (C7506/C7510)"
    work = os.path.join(dump_dir, f"{op}_{tile}")
    rep = ptxas_report(ptx, work)
    regs = assert_clean(rep)
    # setmaxnreg redistributes the CTA's own registers: 128 x low + 256 x high <= 384 x launch regs
    low, high = M.reg_split(slots)
    assert M.reg_split_ok(low, high, regs), (
        f"setmaxnreg {low}/{high} needs more than the launch's {M.THREADS} x {regs} registers")
    tool, path = _sass_tool()
    cubin = os.path.join(work, "mk.ptx.cubin")
    if tool and os.path.exists(cubin):
        args = [path, "--dump-sass", cubin] if tool == "cuobjdump" else [path, cubin]
        sass = subprocess.run(args, capture_output=True, text=True).stdout
        assert "HGMMA" in sass, f"no HGMMA in the SASS ({tool})"
    print(op, tile, f"split {low}/{high}",
          [ln.strip() for ln in rep.splitlines() if "registers" in ln or "spill" in ln])


SPLIT_CASES = [(o, t) for o, t, _ in CASES if o != "LM_HEAD"]


@pytest.mark.parametrize("op,tile", SPLIT_CASES, ids=[f"{o}-{t}" for o, t in SPLIT_CASES])
def test_split_gemm_body_compiles_for_sm90a(dump_dir, op, tile):
    """The slot with split-K compiled in (Megakernel(splitk=...)): the run-time partial path (one
    8-byte float32 store per accumulator pair, both halves for GATE_UP) beside the epilogue, and
    the opcode's SPLITK_REDUCE body; clean ptxas at the variant's setmaxnreg split. Without
    split-K the same slot has no partial store (test_gemm_body_compiles_for_sm90a's PTX)."""
    import mk.megakernel as M

    slots = _slots(op, tile)
    comp = M.compile_fake(gemm=slots, splitk=True)
    regs = assert_split_variant(comp.__ptx__, REQUIRED_PTX, slots[0].cfg.acc_regs() // 2,
                                os.path.join(dump_dir, f"split_{op}_{tile}"))
    low, high = M.reg_split(slots)
    assert M.reg_split_ok(low, high, regs)


@pytest.mark.parametrize("handoff", ["warp", "group"])
def test_split_gemm_body_compiles_other_handoffs(dump_dir, handoff):
    """Split-K's hand-offs in the 8-arrival modes (lane 0 arrives for its warp after __syncwarp:
    the partial stores and the reduce's stores before the `done` the storer waits on)."""
    import mk.megakernel as M
    from mk.ir import Op

    slots = M.class_slots(64, [Op.GATE_UP])
    comp = M.compile_fake(gemm=slots, splitk=True, handoff=handoff)
    ptx = comp.__ptx__
    assert len(re.findall(r"st\.global\.v2\.b32", ptx)) == slots[0].cfg.acc_regs() // 2
    rep = ptxas_report(ptx, os.path.join(dump_dir, f"split_gate_up_{handoff}"))
    assert_clean(rep)




# the C thread-value layout of each tile config's tiled MMA, by tile name (_c_layout_probe)
_C_LAYOUTS = {}


@cute.jit
def _c_layout_probe(cfg: cutlass.Constexpr):
    """Records a tile config's C thread-value layout (shape, stride) in _C_LAYOUTS (at module
    level: the DSL resolves a jit's annotations in its module)."""
    mma = sm90_utils.make_trivial_tiled_mma(
        BFloat16, BFloat16, cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.K,
        Float32, cfg.atom_layout(), tiler_mn=(64, cfg.wn))
    tv = mma.tv_layout_C_tiled
    _C_LAYOUTS[cfg.name] = (tv.shape, tv.stride)


def test_accumulator_fragment_is_what_the_epilogues_assume():
    """Every tile config's tiled MMA hands each consumer thread the m64nN accumulator fragment
    whose element i = e + 2h + 4j is row r + 8h, column c + 8j + e of its first element (the
    C thread-value layout's value mode: shape (2, 2, wn / 8), strides (Mt, 8, 8 Mt) in the
    column-major (Mt, Nt) tile): the RoPE / one-page gate-up partner offsets (PARTNER_64,
    TileConfig.partner) rest on it, and norm_fold=3's self-scaled tiles (gk.row_sumsq: a
    thread's rows are its elements 0 and 2, shared by lanes 4k .. 4k + 3). Lane l holds row
    l / 4, columns 2 (l % 4)."""
    from mk.instructions import _gemm_kernel as gk

    for name, cfg in gk.TILES.items():
        cute.compile(_c_layout_probe, cfg)
        (thr_shape, (val_shape, _)), (thr_stride, (val_stride, _)) = _C_LAYOUTS[name]
        mt = 64 * cfg.atom_layout()[0]              # rows of the tiled MMA's C tile
        assert val_shape == (2, 2, cfg.wn // 8), (name, val_shape)
        assert val_stride == (mt, 8, 8 * mt), (name, val_stride)
        assert thr_shape[:2] == (4, 8) and thr_stride[:2] == (2 * mt, 1), (name, thr_shape)


def _lean_down_k_loop(tmp_path, switches: dict) -> list[str]:
    """The consumers' K loop (hgmma_loop) of the lean DOWN build of the 1024 class with the MK_*
    switches `switches` (every other MK_ variable dropped), compiled in a process of its own:
    the switches are read at import."""
    return hgmma_loop(megakernel_sass(tmp_path, switches, 1024, "lean", "DOWN"), "64x256x16")


@pytest.mark.parametrize("cursor,uniform", [("0", "0"), ("1", "0"), ("1", "1")])
def test_page_cursor_takes_the_divisions_out_of_the_k_loop(tmp_path, cursor, uniform):
    """MK_GEMM_PAGE_CURSOR=1 (the K loop steps its ring position with rk.ring_add): the K loop of
    the lean DOWN build of the 1024 class has no IMAD.HI (page_of's division by NPAGES) left,
    where the old loop has them; both issue the tile's four HGMMA.64x256x16 a K step.
    MK_GEMM_UNIFORM_PAGES=1 on top (with the cursor, the default): the wgmma descriptors are
    built in uniform registers, so the loop moves at most 4 words from vector registers (R2UR)
    where it moved 16."""
    loop = _lean_down_k_loop(tmp_path, {"MK_GEMM_PAGE_CURSOR": cursor,
                                        "MK_GEMM_UNIFORM_PAGES": uniform})
    assert sum("HGMMA.64x256x16" in ln for ln in loop) == 4
    divisions = sum("IMAD.HI" in ln for ln in loop)
    assert (divisions == 0) if cursor == "1" else (divisions > 0), (cursor, divisions)
    moves = sum(" R2UR " in ln for ln in loop)
    assert (moves <= 4) if uniform == "1" else (moves >= 16), (uniform, moves)
