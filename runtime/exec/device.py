"""Where the engine runs: resolving `--device` and `--dtype`, and how much memory the KV pool may take."""

from __future__ import annotations

import os

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "fp32": torch.float32, "bf16": torch.bfloat16}


def check_device_name(name: str) -> None:
    """The one check of a `--device` value's form (EngineArgs.validate calls it up front)."""
    if not (name in ("auto", "cpu", "cuda") or name.startswith("cuda:")):
        raise ValueError(f"device must be auto, cpu or cuda[:N], got {name!r}")


def resolve_device(name: str) -> torch.device:
    """`auto` is cuda when CUDA is available, else cpu. Asking for cuda without it is one clear error."""
    check_device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"--device {name}: CUDA is not available here (torch {torch.__version__}, "
                               f"CUDA build: {torch.version.cuda or 'no'}); use --device cpu")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise RuntimeError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
        return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def resolve_dtype(name: str) -> torch.dtype:
    """`auto` is bfloat16 (on CUDA always; on the CPU measured best where it has bf16 units: see docs/benchmarks.md)."""
    if name == "auto":
        return torch.bfloat16
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (the page cache counts as available), else total RAM."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def free_bytes(device: torch.device) -> int:
    """Memory the KV pool may be carved from now: free GPU memory, or available RAM."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return host_available_bytes()


def default_kv_fraction(device: torch.device) -> float:
    # The CPU shares RAM with everything else on the machine; a GPU is the engine's own.
    return 0.85 if device.type == "cuda" else 0.2


def default_max_kv_tokens(device: torch.device) -> int | None:
    return None if device.type == "cuda" else 262144
