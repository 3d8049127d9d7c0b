"""The CPU kernels' other loops, run here: the kernels built for older CPU kinds than this one.

`make test` builds the kernels for this machine (-march=native) only, so on a Zen 4 the portable
loops (AVX2-only CPUs) and the float32 AVX-512 loops (AVX-512 without bf16: Skylake-X, Cascade
Lake) are never run. Each case builds the kernels for one older kind in a child process
(tests/kernels/other_kinds.py) and runs the block-kernel tests against that build. A kind this
machine cannot run is skipped. Slow (a kernel build each): `make test-all`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/kernels/test_int4_gemv.py", "tests/kernels/test_group_scales.py", "tests/kernels/test_int4_q8_gemv.py",
         "tests/kernels/test_group_q8_gemv.py",
         "tests/kernels/test_group_gemv.py", "tests/runtime/cpu/test_block_weights.py",
         "tests/runtime/cpu/test_block_experts_one_call.py", "tests/kernels/test_tile_unit.py"]
# -march name, the /proc/cpuinfo flags it needs to run here
KINDS = {"x86-64-v3": {"avx2", "fma", "bmi2"},
         "skylake-avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"},
         "cascadelake": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}}


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@pytest.mark.slow
@pytest.mark.parametrize("march", list(KINDS))
def test_the_block_kernels_built_for_an_older_kind(march: str, tmp_path: Path) -> None:
    if not KINDS[march] <= cpu_flags():
        pytest.skip(f"this CPU cannot run -march={march}")
    run = subprocess.run([sys.executable, str(ROOT / "tests/kernels/other_kinds.py"), march, str(tmp_path), *TESTS],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert f"{march}: int4_gemv_fast=" in run.stdout and " passed" in run.stdout
