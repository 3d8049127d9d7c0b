"""Run kernel tests against the CPU kernels built for another CPU kind (a child process).

    python tests/kernels/other_kinds.py MARCH BUILD_DIR pytest-args...

Builds kernels/csrc for `-march=MARCH` into BUILD_DIR, points kernels.cpu_ops.ops at that build,
and runs pytest with the given arguments. The machine must be able to run MARCH's instructions
(an older kind than its own): that is how the AVX2-only and AVX-512-without-bf16 loops are
exercised on a machine that would otherwise build only its own (tests/kernels/test_other_kinds.py).
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.cpp_extension import load

import kernels.cpu_ops as cpu_ops


def main() -> int:
    march, folder, *args = sys.argv[1:]
    load(cpu_ops.NAME, [str(source) for source in cpu_ops.SOURCES], extra_cflags=["-O2", f"-march={march}", "-fopenmp"],
         extra_ldflags=["-fopenmp"], build_directory=folder, is_python_module=False, verbose=False)
    built = getattr(torch.ops, cpu_ops.NAME)
    cpu_ops.ops = lambda: built  # before the tests (and the modules they import) take `ops`
    print(f"{march}: int4_gemv_fast={built.int4_gemv_fast()} q6_gemv_fast={built.q6_gemv_fast()} "
          f"int4_gemv_q8_fast={built.int4_gemv_q8_fast()}", flush=True)
    return int(pytest.main(["-q", "-p", "no:cacheprovider", *args]))


if __name__ == "__main__":
    sys.exit(main())
