"""Builds and loads the fused CPU kernels of kernels/csrc/ (cpu_ops.cpp: norms, rotary, decode
attention; group_gemv.cpp: few-row products with a GGUF's 8-bit group weights; int4_gemv.cpp:
few-row products with 4-bit group weights; group_dequant.cpp: rows of either dequantized for wide
products; group_scales.cpp: a GGUF's float32 group scales factored into a byte a group;
gguf_blocks.cpp: a GGUF's quantized blocks decoded into the layouts those kernels read;
q6_gemv.cpp: few-row products with 6-bit codes and bf16 activations; int4_q8_gemv.cpp and
group_q8_gemv.cpp: few-row products of 4-bit (Q4_K) and 6-bit (Q6_K) k-quant codes with int8
activations; weight_prefetch.cpp: the line past which those kernels prefetch their weights;
int4_amx.cpp and q6_amx.cpp: products of a few bf16 rows with 4- and 6-bit weights in AMX's tile
unit, tile_unit.h), once per machine.

The files are compiled into one library with the machine's own compiler for its own cores
(`-march=native`) by torch's C++ extension builder, into `~/.cache/radixserve/cpu-ops/<key>`
(RADIXSERVE_HOME moves it), where the key covers the sources, torch's version and the CPU's
flags: a later start, or another process, loads the built library in milliseconds, and a machine
of another kind never loads code built for instructions it lacks. `make install` builds it
(`kernels.cpu_ops.main`) so the first server start does not pay the quarter minute it takes.

Where it cannot be built (no C++ compiler, RADIXSERVE_CPU_OPS=0), `ops()` is None and the
callers (runtime/layers/fused.py, kernels/torch_attention.py) run the torch ops these kernels
replace, with the same results up to the order of float sums.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("cpu_ops.cpp", "group_gemv.cpp", "int4_gemv.cpp",
                                                                         "group_dequant.cpp", "group_scales.cpp",
                                                                         "gguf_blocks.cpp", "q6_gemv.cpp", "int4_q8_gemv.cpp",
                                                                         "group_q8_gemv.cpp", "weight_prefetch.cpp",
                                                                         "int4_amx.cpp", "q6_amx.cpp"))
HEADERS = tuple(Path(__file__).with_name("csrc") / name for name in ("row_count.h", "group_scales.h", "weight_store.h",
                                                                        "weight_prefetch.h", "int4_blocks.h", "activations16.h",
                                                                        "activations8.h", "vector_sum.h", "int16_panel.h",
                                                                        "q8_panel.h", "six_bit_codes.h",
                                                                        "expert_rows.h", "tile_unit.h", "q6_blocks.h"))  # included by the sources: part of the key
NAME = "radixserve_cpu"
KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # the activation dtypes the kernels are built for


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def build_dir() -> Path:
    key = hashlib.sha256(b"\0".join([*(source.read_bytes() for source in (*SOURCES, *HEADERS)), torch.__version__.encode(),
                                     sys.version.encode(), _cpu_flags().encode()])).hexdigest()[:16]
    home = Path(os.environ.get("RADIXSERVE_HOME", Path.home() / ".cache" / "radixserve"))
    return home / "cpu-ops" / key


@contextlib.contextmanager
def builder_lock(folder: Path) -> Iterator[None]:
    """One builder of `folder` at a time across processes, by a lock the kernel drops when its
    holder dies. torch's own (the file `lock`, FileBaton) outlives a process killed mid-build, and
    the next start then waited on it forever, silently; under this lock no other builder is alive,
    so a `lock` found is such a leftover and is removed."""
    with open(folder / "builder.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = folder / "lock"
        if stale.exists():
            logger.warning("removing %s, left by a kernel build that did not finish", stale)
            stale.unlink(missing_ok=True)
        yield


@functools.cache
def ops() -> object | None:
    """torch.ops.radixserve_cpu, built here if it was not; None where it cannot be."""
    if os.environ.get("RADIXSERVE_CPU_OPS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load

        folder = build_dir()
        folder.mkdir(parents=True, exist_ok=True)
        if shutil.which("ninja") is None:  # the `ninja` wheel's binary sits beside this interpreter
            os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        with builder_lock(folder):
            # -fopenmp: at::parallel_for is inline OpenMP, so without it every kernel runs on one
            # thread; the library shares torch's own OpenMP runtime and thread pool
            load(NAME, [str(source) for source in SOURCES], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                 extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=False, verbose=False)
        return getattr(torch.ops, NAME)
    except Exception as exc:  # noqa: BLE001 - serving with torch ops beats not serving
        logger.warning("fused CPU kernels unavailable, running torch ops instead: %s", exc)
        return None


def main() -> None:
    """`make install` builds the kernels here, so the first server start finds them built."""
    logging.basicConfig(level=logging.INFO)
    print(f"fused CPU kernels: {'built in ' + str(build_dir()) if ops() is not None else 'unavailable (torch ops)'}")


if __name__ == "__main__":
    main()
