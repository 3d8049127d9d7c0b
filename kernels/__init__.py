"""kernels: attention over a ragged batch and the paged KV pool.

One interface, two backends: `torch` (the reference and the CPU default) and `triton`. Imports
nothing else from the project (docs/architecture.md's tour says how the packages layer).
"""

from kernels.metadata import AttentionMetadata
from kernels.torch_attention import TorchAttentionBackend

BACKENDS = ("auto", "torch", "triton")


def check_backend_name(name: str) -> None:
    """The one check of an attention backend's name (EngineArgs.validate calls it up front)."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {name!r}")


def get_attention_backend(name: str = "auto", device: str = "cpu") -> object:
    """`auto` picks triton on CUDA and torch on the CPU."""
    check_backend_name(name)
    if name == "auto":
        name = "triton" if device.startswith("cuda") else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    from kernels.triton_attention import TritonAttentionBackend

    return TritonAttentionBackend()


__all__ = ["AttentionMetadata", "BACKENDS", "TorchAttentionBackend", "check_backend_name", "get_attention_backend"]
