"""torch.distributed helpers for the launchers and the engine.

One process per GPU (or per CPU rank with gloo), started by torchrun; the tensor-parallel group is
the whole world. Never NVLink multicast on the lent machines (see DESIGN.md): the launchers call
`disable_multicast()` before anything touches NCCL or NVSHMEM.
"""

from __future__ import annotations

import os

import torch

MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def disable_multicast() -> None:
    for k, v in MULTICAST_OFF.items():
        os.environ.setdefault(k, v)


def launched_world_size() -> int:
    """WORLD_SIZE as set by torchrun (1 when run as a plain process)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_initialized() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def default_device() -> torch.device:
    """cuda:LOCAL_RANK when a GPU is visible, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(device: torch.device | None = None) -> bool:
    """Initialize the default process group when launched by torchrun with WORLD_SIZE > 1.

    NCCL on GPU, gloo on CPU. Returns True when a group of more than one rank is active.
    """
    import torch.distributed as dist
    if is_initialized():
        return dist.get_world_size() > 1
    if launched_world_size() <= 1:
        return False
    disable_multicast()
    device = device or default_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device)
    else:
        dist.init_process_group(backend="gloo")
    return True


def rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    import torch.distributed as dist
    return dist.get_world_size() if is_initialized() else 1


def tp_group_and_rank(group=None) -> tuple[object | None, int, int]:
    """(group, tp_size, tp_rank): the given group, else the world when initialized, else none."""
    import torch.distributed as dist
    if group is None and not is_initialized():
        return None, 1, 0
    if group is None:
        group = dist.group.WORLD
    return group, dist.get_world_size(group), dist.get_rank(group)


def destroy() -> None:
    import torch.distributed as dist
    if is_initialized():
        dist.destroy_process_group()
