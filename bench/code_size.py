"""Where the megakernel's machine code goes: SASS instructions per Python function (CPU only).

Why: an SM runs one instruction body at a time, most of them once per layer, in a kernel of
~30k SASS instructions (~475 KB), far more than an SM's instruction cache; the weights streaming
through L2 evict the code between visits, so a body's code is fetched cold on every visit. In
session 7 the ATTENTION storer's 16-way unrolled epilogue copy cost 12 us of a 46 us instruction
at B=1 (6.3 us for a page with nothing to store; bench/E2E_NOTES.md). This report says which
bodies carry how much code, so that code size can be cut where it is cold.

    python bench/code_size.py                    # the M64 all-opcode variant, top 30 functions
    python bench/code_size.py --m 256 --top 50 --json bench/results/code_size.json
    MK_ATTN_STORE=loop python bench/code_size.py # any compile-time switch of the environment

How: the variant is compiled for sm_90a on fake tensors with CUTE_DSL_LINEINFO=1, assembled
with `ptxas -lineinfo` and disassembled with `nvdisasm -g`; each instruction is charged to the
innermost Python function whose lines hold its source line (the DSL inlines everything and
its line table keeps only the innermost location, so a helper's code counts once however many
bodies call it; `--by line` lists the heaviest source lines instead). Needs ptxas and nvdisasm
(the test extra's nvidia-cuda-nvcc and nvidia-cuda-nvdisasm wheels, or a CUDA toolkit).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from mk.cuda_tools import find_tool  # noqa: E402
SASS_BYTES = 16                    # one sm_90 instruction
_FILE_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*(/\*.*)?$")


def function_spans(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function and class in a Python file,
    innermost last among those that hold a line (sorted by start, nested ones after)."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError):
        return []
    out = []

    def walk(node, prefix):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{ch.name}"
                first = min([ch.lineno] + [d.lineno for d in ch.decorator_list])
                out.append((first, ch.end_lineno, name))
                walk(ch, name + ".")
            else:
                walk(ch, prefix)
    walk(tree, "")
    return sorted(out)


class Attributor:
    """(file, line) -> the innermost function holding it ("<file>:<module>" outside any)."""

    def __init__(self):
        self._spans: dict[str, list] = {}

    def __call__(self, path: str, line: int) -> str:
        if path not in self._spans:
            self._spans[path] = function_spans(path)
        best = None
        for first, last, name in self._spans[path]:
            if first <= line <= last:
                best = name                  # later (nested) spans win
            elif first > line:
                break
        return f"{short_path(path)}:{best or '<module>'}"


def short_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def parse_sass(text: str):
    """Yields (file, line, instruction text) for every instruction of `nvdisasm -g` output; an
    instruction before any line annotation has file None."""
    cur = (None, 0)
    for raw in text.splitlines():
        m = _FILE_LINE.search(raw)
        if m:
            cur = (m.group(1), int(m.group(2)))
            continue
        m = _INSTR.match(raw)
        if m and m.group(1):
            yield cur[0], cur[1], m.group(1)


def summarize(text: str, by: str = "function") -> dict:
    """Instruction counts of an annotated disassembly: total, per function (or per source line),
    per file, and HGMMA / bulk-copy counts (the compile gate's SASS facts)."""
    attr = Attributor()
    per, files = Counter(), Counter()
    total = hgmma = unknown = 0
    for path, line, ins in parse_sass(text):
        total += 1
        hgmma += ins.split()[0].startswith("HGMMA") if ins.split() else 0
        if path is None:
            unknown += 1
            key = "<no line info>"
        else:
            files[short_path(path)] += 1
            key = attr(path, line) if by == "function" else f"{short_path(path)}:{line}"
        per[key] += 1
    return dict(total=total, bytes=total * SASS_BYTES, hgmma=hgmma, unattributed=unknown,
                per=dict(per.most_common()), files=dict(files.most_common()))


def compile_sass(m: int, workdir: str, build: str = "full", op: str = "GATE_UP",
                 plan: dict | None = None) -> str:
    """The megakernel variant of M class m, annotated SASS text: build "full" the all-opcode
    one (as the backend builds it), else mk.megakernel.BUILDS' (lean: op's GEMM slot alone;
    gemms: every slot, no attention or gather; families: op's slot with attention and gather).
    Split-K code only for the opcodes the backend's plans may split in that class
    (PlanConfig.split_ops), as the backend compiles it: its default plan with the overrides
    `plan` (PlanConfig fields; norm_fold=3 also compiles the self-scaled tiles' code)."""
    os.environ["CUTE_DSL_LINEINFO"] = "1"      # before cutlass is imported
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import mk.megakernel as M
    ptxas, nvdisasm = find_tool("ptxas"), find_tool("nvdisasm")
    missing = [n for n, t in (("ptxas", ptxas), ("nvdisasm", nvdisasm)) if t is None]
    if missing:
        raise SystemExit(f"code_size: {', '.join(missing)} not found: pip install "
                         "nvidia-cuda-nvcc nvidia-cuda-nvdisasm (the test extra), or set CUDA_HOME")
    from mk.ir import Op
    from mk.megakernel_step import class_split_ops, default_plan_config
    one_slot, families = M.BUILDS[build]
    cfg = default_plan_config(**(plan or {}))
    split_ops = class_split_ops(cfg, m)
    comp = M.compile_fake(gemm=M.class_slots(m, ops=(Op[op],) if one_slot else M.GEMM_OPS,
                                             split_ops=split_ops,
                                             self_scale=cfg.norm_fold == 3,
                                             row_parts=cfg.norm_fold == 4),
                          attn_page_size=(16 if m <= 256 else 64) if families else 0,
                          gather=families, splitk=True)
    ptx = comp.__ptx__
    if ".loc" not in ptx:
        raise SystemExit("code_size: the PTX has no line table (CUTE_DSL_LINEINFO was not honoured)")
    src = os.path.join(workdir, "mk.ptx")
    Path(src).write_text(ptx)
    cubin = src + ".cubin"
    r = subprocess.run([ptxas, "-arch=sm_90a", "-lineinfo", src, "-o", cubin],
                       capture_output=True, text=True)
    ver = re.search(r"current version is '(\d+\.\d+)'", r.stdout + r.stderr)
    if r.returncode and ver:                    # an older local ptxas: lower the PTX ISA line
        Path(src).write_text(re.sub(r"^\.version \d+\.\d+", f".version {ver.group(1)}", ptx,
                                    flags=re.M))
        r = subprocess.run([ptxas, "-arch=sm_90a", "-lineinfo", src, "-o", cubin],
                           capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"code_size: ptxas failed:\n{(r.stdout + r.stderr)[-2000:]}")
    r = subprocess.run([nvdisasm, "-c", "-g", cubin], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"code_size: nvdisasm failed:\n{r.stderr[-2000:]}")
    return r.stdout


def format_report(s: dict, top: int) -> str:
    lines = [f"{s['total']} SASS instructions ({s['bytes'] / 1024:.0f} KiB), {s['hgmma']} HGMMA, "
             f"{s['unattributed']} without line info",
             f"{'instructions':>12} {'KiB':>6} {'share':>6}  where"]
    for key, n in list(s["per"].items())[:top]:
        lines.append(f"{n:>12} {n * SASS_BYTES / 1024:>6.1f} {n / s['total']:>6.1%}  {key}")
    lines.append("per file: " + ", ".join(f"{k} {v}" for k, v in s["files"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=64, help="M class of the variant (64, 256, 1024, "
                    "4096; default %(default)s)")
    ap.add_argument("--build", choices=("full", "lean", "gemms", "families"), default="full",
                    help="which opcodes compile in (mk.megakernel.BUILDS; default the step's)")
    ap.add_argument("--op", default="GATE_UP", choices=("O_PROJ", "GATE_UP", "DOWN", "LM_HEAD"),
                    help="the GEMM opcode of the lean / families builds")
    ap.add_argument("--plan", default="", metavar="FIELD=VALUE,...",
                    help="PlanConfig overrides of the backend's default plan (which split code "
                         "compiles in; norm_fold=3: the self-scaled tiles' code)")
    ap.add_argument("--by", choices=("function", "line"), default="function")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", help="also write the whole summary here")
    a = ap.parse_args(argv)
    from mk.plan import parse_plan_overrides
    try:
        plan = parse_plan_overrides(a.plan) if a.plan else {}
    except ValueError as e:
        ap.error(f"--plan: {e}")
    with tempfile.TemporaryDirectory(prefix="mk_code_size_") as work:
        s = summarize(compile_sass(a.m, work, a.build, a.op, plan), a.by)
    switches = {k: v for k, v in sorted(os.environ.items())
                if k.startswith("MK_") and k not in ("MK_CACHE_DIR",)}
    build = a.build if a.build == "full" else f"{a.build} ({a.op})"
    print(f"[code_size] M class {a.m}, build {build}, plan {a.plan or 'default'}, switches "
          f"{switches or 'none'}")
    print(format_report(s, a.top))
    if a.json:
        try:
            commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = ""
        Path(a.json).write_text(json.dumps(dict(m_class=a.m, build=a.build, op=a.op, by=a.by,
                                                plan=plan, switches=switches,
                                                git_commit=commit, **s), indent=1))
        print(f"[code_size] wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
