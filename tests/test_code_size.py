"""bench/code_size.py: the SASS attribution (synthetic, always) and the real M64 variant's code
(compiled on the CPU; needs ptxas and nvdisasm, both in the test extra)."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import code_size as cs  # noqa: E402


def test_attribution_charges_the_innermost_function(tmp_path):
    src = tmp_path / "body.py"
    src.write_text(textwrap.dedent('''\
        X = 1

        def outer(a):
            b = a + 1

            def inner(c):
                return c * 2
            return inner(b)


        class K:
            @staticmethod
            def meth(d):
                return d
        '''))
    sass = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        f'\t//## File "{src}", line 4',
        "        /*0010*/                   IADD3 R2, R1, 0x1, RZ ;",
        f'\t//## File "{src}", line 7',
        "        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;",
        "        /*0030*/                   IMAD R3, R2, 0x2, RZ ;",
        f'\t//## File "{src}", line 14',
        "        /*0040*/                   @!P0 BRA `(.L_x_1) ;",
        f'\t//## File "{src}", line 1',
        "        /*0050*/                   EXIT ;",
    ])
    s = cs.summarize(sass)
    assert s["total"] == 6 and s["bytes"] == 96 and s["hgmma"] == 1 and s["unattributed"] == 1
    name = cs.short_path(str(src))
    assert s["per"] == {f"{name}:outer.inner": 2, "<no line info>": 1, f"{name}:outer": 1,
                        f"{name}:K.meth": 1, f"{name}:<module>": 1}
    by_line = cs.summarize(sass, by="line")["per"]
    assert by_line[f"{name}:7"] == 2 and sum(by_line.values()) == 6
    assert "outer.inner" in cs.format_report(s, 3)


def test_megakernel_m64_code_by_function(tmp_path):
    """The all-opcode M64 variant's SASS (bench/code_size.py in a process of its own: the DSL reads
    CUTE_DSL_LINEINFO once, at import): HGMMA present (the consumers' wgmma, issue 5's SASS
    check), every instruction has a source line, and the bodies the report exists for show up."""
    import json
    import subprocess
    pytest.importorskip("cutlass")
    if cs.find_tool("ptxas") is None or cs.find_tool("nvdisasm") is None:
        pytest.fail("ptxas / nvdisasm missing: pip install -e '.[test]' brings both")
    out = tmp_path / "code_size.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MK_")}
    r = subprocess.run([sys.executable, str(cs.ROOT / "bench" / "code_size.py"), "--m", "64",
                        "--top", "15", "--json", str(out)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    s = json.loads(out.read_text())
    assert s["hgmma"] > 0 and s["unattributed"] == 0, (s["hgmma"], s["unattributed"])
    assert s["total"] > 10000 and s["switches"] == {}
    names = set(s["per"])
    for body in ("_attention_kernel.py:attn_consume", "_gemm_kernel.py:gemm_consume",
                 "_rows_kernel.py:rmsnorm_consume", "_attention_kernel.py:store_chunk"):
        assert any(n.endswith(body) for n in names), body
    print(r.stdout)


@pytest.mark.parametrize("build", ["full", "lean", "gemms", "families"])
def test_builds_compile_what_mk_megakernel_builds_says(monkeypatch, tmp_path, build):
    """--build: which GEMM slots and families the compiled variant has (mk.megakernel.BUILDS,
    the same table launch/bench.py --isolated-builds uses): full every slot with attention and
    gather, lean the --op slot alone, gemms every slot alone, families the slot with them."""
    pytest.importorskip("cutlass")
    import mk.megakernel as M
    from mk.ir import Op
    seen = {}

    class Compiled(Exception):
        pass

    def compile_fake(**kw):
        seen.update(kw)
        raise Compiled
    monkeypatch.setattr(M, "compile_fake", compile_fake)
    monkeypatch.setattr(cs, "find_tool", lambda name: "/bin/true")
    # compile_sass sets them in os.environ (for the DSL's import): restored after the test, so
    # that later compiles in this worker do not inherit line info
    monkeypatch.setenv("CUTE_DSL_LINEINFO", os.environ.get("CUTE_DSL_LINEINFO", "0"))
    monkeypatch.setenv("CUTE_DSL_ARCH", os.environ.get("CUTE_DSL_ARCH", "sm_90a"))
    with pytest.raises(Compiled):
        cs.compile_sass(1024, str(tmp_path), build, "DOWN")
    ops = {g.op for g in seen["gemm"]}
    one_slot = build in ("lean", "families")
    assert ops == ({int(Op.DOWN)} if one_slot else {int(o) for o in M.GEMM_OPS})
    families = build in ("full", "families")
    assert (seen["attn_page_size"] > 0, seen["gather"]) == (families, families)
    assert seen["splitk"] is True
