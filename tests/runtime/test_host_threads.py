"""Building an engine starts no OpenMP pool on the caller's thread (runtime/cpu/host_threads.py says why).

A second pool makes libgomp throttle its waits and every small op of the engine thread slower.
Checked by counting the process's OS threads in a fresh interpreter: building the engine may
add only the engine thread; the engine thread's own pool appears with its first step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import os, sys, torch
def threads(): return len(os.listdir("/proc/self/task"))
from runtime import Engine
torch.ones(1)  # torch's own start-up threads, if any, before counting
before, count = threads(), torch.get_num_threads()
engine = Engine(model=sys.argv[1], dtype="float32", kv_cache_tokens=300000)
built = threads()
engine.generate(input_ids=[[5, 6, 7]], sampling_params={"max_new_tokens": 3, "temperature": 0})
print(before, built, threads(), torch.get_num_threads() == count)
engine.shutdown()
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2, reason="needs Linux, 2+ CPUs")
def test_building_an_engine_starts_no_thread_pool_on_the_callers_thread(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder)], cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, built, after, restored = proc.stdout.split()[-4:]
    assert int(built) == int(before) + 1, (before, built)  # the engine thread, no OpenMP workers
    assert int(after) > int(built)  # its pool came with the first step
    assert restored == "True"  # the caller's intra-op thread count is as it was
