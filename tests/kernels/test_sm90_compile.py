"""Every Triton kernel compiles for the H100 (sm_90, down to cubin) with the types its launcher passes.

Runs in a subprocess because this test session interprets Triton (TRITON_INTERPRET=1 is set
before any kernel is defined), and the interpreter accepts code the compiler rejects.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_kernel_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.sm90_compile"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    compiled = {line.split(":")[0] for line in proc.stdout.splitlines() if "sm_90 cubin" in line}
    assert compiled == {"_store_kv", "_extend", "_decode_split", "_decode_merge"}, proc.stdout
