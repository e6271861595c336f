"""Where the CUDA binaries the CPU tooling runs come from (ptxas, nvdisasm, cuobjdump).

The nvidia-* wheels of the test extra first (their ptxas matches the CuTe DSL's PTX ISA), then
PATH, then $CUDA_HOME/bin (default /usr/local/cuda). CPU-importable, no cutlass."""

from __future__ import annotations

import os
import shutil


def find_tool(name: str) -> str | None:
    """Path of CUDA binary `name`, or None where none is installed."""
    try:
        import nvidia.cu13 as cu13
        for root in cu13.__path__:
            c = os.path.join(root, "bin", name)
            if os.path.exists(c):
                return c
    except ImportError:
        pass
    for c in (shutil.which(name),
              os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", name)):
        if c and os.path.exists(c):
            return c
    return None
