"""mk.megakernel's compile cache on disk (MK_COMPILE_CACHE=DIR): the file name of a variant
changes with everything its code generation reads, a variant round-trips through the DSL's AOT
export and load (CPU: compiled for sm_90a on fake tensors), and on a Hopper GPU a second process
loads the first one's variants instead of compiling them and its step still matches the
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
KEY = (False, "thread", 0, (), 16, True, True, False, False, (4, 8, 16), (2, 8))

try:
    import cutlass
    import cutlass.cute as cute
except ImportError:     # the tests that need it skip
    cute = None

if cute is not None:
    # a kernel small enough to compile in a second (a stream argument would need the CUDA
    # runtime's symbols to export: the megakernel's own export is the GPU test's)
    @cute.kernel
    def bump(x: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        x[tidx] = x[tidx] + 1

    @cute.jit
    def launch_bump(x: cute.Tensor):
        bump(x).launch(grid=[1, 1, 1], block=[32, 1, 1])


def test_cache_name_follows_key_arguments_and_switches(monkeypatch):
    pytest.importorskip("cutlass")
    from cutlass import Int32
    from cutlass.cute.runtime import from_dlpack

    import mk.megakernel as M
    t = torch.zeros(4, 8)
    a = from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=1)
    name = M.compile_cache_name(KEY, [a, Int32(3)])
    assert name.startswith("mk_") and len(name) == 43
    # the same key and argument types: the same name, whatever the tensor's address and values
    b = from_dlpack(torch.ones(4, 8), assumed_align=16).mark_layout_dynamic(leading_dim=1)
    assert M.compile_cache_name(KEY, [b, Int32(7)]) == name
    # another key, element type, alignment or static layout: another name
    assert M.compile_cache_name(KEY[:-1] + ((2, 16),), [a, Int32(3)]) != name
    c = from_dlpack(torch.zeros(4, 8, dtype=torch.bfloat16), assumed_align=16)
    assert M.compile_cache_name(KEY, [c.mark_layout_dynamic(leading_dim=1), Int32(3)]) != name
    d = from_dlpack(t, assumed_align=4).mark_layout_dynamic(leading_dim=1)
    assert M.compile_cache_name(KEY, [d, Int32(3)]) != name
    assert M.compile_cache_name(KEY, [from_dlpack(t, assumed_align=16), Int32(3)]) != name
    # a compile-time switch (read at import) changes it; the cache's own directory does not
    monkeypatch.setenv("MK_TILES", "DOWN@max=m128n128")
    assert M.compile_cache_name(KEY, [a, Int32(3)]) != name
    monkeypatch.delenv("MK_TILES")
    monkeypatch.setenv("MK_COMPILE_CACHE", "/elsewhere")
    assert M.compile_cache_name(KEY, [a, Int32(3)]) == name
    # nor do a script's own variables (mk.provenance.knob_env: only the ones mk reads count)
    monkeypatch.setenv("MK_STEPS", "verify")
    monkeypatch.setenv("MK_COMMIT", "0123abc")
    assert M.compile_cache_name(KEY, [a, Int32(3)]) == name


def test_the_cache_directory_is_the_user_cache_unless_turned_off(tmp_path):
    import mk.megakernel as M
    home = os.path.expanduser("~")
    user = os.path.join(home, ".cache", "mk", "kernels")
    assert M.compile_cache_dir({}) == user
    assert M.compile_cache_dir({"MK_COMPILE_CACHE": "on"}) == user
    assert M.compile_cache_dir({"MK_CACHE_DIR": "/c"}) == "/c/kernels"
    # the tiny checkpoints' root (mk.config.cache_root): $MK_CACHE_DIR where set
    assert M.compile_cache_dir({"MK_COMPILE_CACHE": "1", "MK_CACHE_DIR": "/c"}) == "/c/kernels"
    assert M.compile_cache_dir({"MK_COMPILE_CACHE": str(tmp_path)}) == str(tmp_path)
    for off in ("", "0", "off", "OFF", " none "):
        assert M.compile_cache_dir({"MK_COMPILE_CACHE": off, "MK_CACHE_DIR": "/c"}) == ""


def test_prune_keeps_the_most_recently_used_variants(tmp_path):
    import mk.megakernel as M
    for i in range(5):
        f = tmp_path / f"mk_{i}.o"
        f.write_bytes(b"x")
        os.utime(f, (1000 + i, 1000 + i))
    os.utime(tmp_path / "mk_0.o", (2000, 2000))     # loaded lately: kept though made first
    (tmp_path / "notes.txt").write_text("not a variant")
    (tmp_path / ".export_abc").mkdir()                # another process's export under way
    M._cache_prune(str(tmp_path), 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".export_abc", "mk_0.o", "mk_3.o",
                                                          "mk_4.o", "notes.txt"]


def round_trip(cache_dir: str) -> None:
    """Store a compiled kernel, load it back, and try a missing and a corrupt file (run in a
    process whose CUTE_DSL_ARCH was set before the DSL's import: without a GPU the export
    resolves its host code against that target only)."""
    from cutlass.cute.runtime import make_fake_compact_tensor

    import mk.megakernel as M
    comp = cute.compile[cute.GPUArch("sm_90a")](launch_bump,
                                               make_fake_compact_tensor(cutlass.Float32, (32,)))
    print("absent", M._cache_load(cache_dir, "mk_absent"))
    M._cache_store(comp, cache_dir, "mk_probe")
    print("files", sorted(os.listdir(cache_dir)))
    loaded = M._cache_load(cache_dir, "mk_probe")
    print("loaded", callable(loaded), type(loaded).__name__ == type(comp).__name__)
    with open(os.path.join(cache_dir, "mk_bad.o"), "wb") as f:
        f.write(b"not an object file")
    print("bad", M._cache_load(cache_dir, "mk_bad"))


def test_a_variant_round_trips_through_the_disk(tmp_path):
    """_cache_store exports a compiled function whole into the directory (nothing else left
    there), _cache_load gives back a callable compiled function; a missing or corrupt file is a
    miss (None; the corrupt one reported), not an error."""
    pytest.importorskip("cutlass")
    code = ("import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n"
            "import test_compile_cache as t; t.round_trip(sys.argv[1])\n"
            % (str(ROOT / "tests"), str(ROOT)))
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("[")]
    assert lines == ["absent None", "files ['mk_probe.o']", "loaded True True", "bad None"], \
        r.stdout + r.stderr[-3000:]
    assert "mk_bad.o not loaded" in r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="needs a Hopper GPU")
def test_a_second_process_loads_the_variants_and_still_matches(tmp_path):
    """Two processes run the same two-layer step check (tiny model, checked against mk.vm) with
    one MK_COMPILE_CACHE: the first compiles and stores its variants, the second loads them all
    (no compile) and passes too."""
    # ROOT ahead of the caller's PYTHONPATH, not instead of it: the DSL itself may live there
    # (the GPU machine's prelude puts it on PYTHONPATH)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, MK_COMPILE_CACHE=str(tmp_path / "cache"), PYTHONPATH=path)
    cmd = [sys.executable, "-m", "mk.megakernel_step", "check", "--layers", "2",
           "--split-k", "0", "--decode-steps", "1"]
    outs = []
    for _ in range(2):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        assert '"passed": true' in r.stdout, r.stdout[-3000:]
        outs.append(r.stdout + r.stderr)
    assert "compiled variant" in outs[0] and list((tmp_path / "cache").glob("mk_*.o"))
    assert "loaded from" in outs[1] and "compiled variant" not in outs[1], outs[1][-3000:]


def test_a_loaded_variant_takes_its_blocks_per_sm_from_the_device_limits(monkeypatch):
    """A variant loaded from the cache keeps no cubin for the occupancy query: the grid comes
    from the device limits, said plainly (not as an error), one block a SM for this kernel's
    shared memory on a Hopper's 228 KiB."""
    pytest.importorskip("cutlass")
    import types

    import mk.megakernel as M
    props = types.SimpleNamespace(shared_memory_per_multiprocessor=233472,
                                  max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=0: props)
    loaded = types.SimpleNamespace()            # what cute.runtime.load_module's function lacks
    blocks, how = M.resident_blocks_per_sm(loaded, M.smem_bytes_estimate())
    assert blocks == 1
    assert how == "device limits (no cubin to query: a variant loaded from the compile cache)"
