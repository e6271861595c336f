"""mk: a throughput megakernel for Llama-family LLM inference.

`import mk` never touches CUDA: GPU-only modules (mk.megakernel, mk.comm) load on first use.
"""

__version__ = "0.1.0"

from mk.config import ConfigError, KernelConfig, ModelConfig, ParallelConfig  # noqa: F401


def __getattr__(name):
    # The engine pulls in torch.distributed and the backends; load it on first use.
    if name == "Engine":
        from mk.engine import Engine
        return Engine
    raise AttributeError(f"module 'mk' has no attribute {name!r}")
