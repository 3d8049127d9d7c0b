"""Building an engine starts no OpenMP pool on the caller's thread (runtime/cpu/host_threads.py says why).

A second pool makes libgomp throttle its waits and every small op of the engine thread slower.
Checked by counting the process's OS threads in a fresh interpreter: building the engine adds
the engine thread and at most its own pool (count - 1 workers, started when it warms up before
the first step), and serving adds no other.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """
import os, sys, torch
def threads(): return len(os.listdir("/proc/self/task"))
from runtime import Engine
torch.ones(1)  # torch's own start-up threads, if any, before counting
before, count = threads(), torch.get_num_threads()
engine = Engine(model=sys.argv[1], dtype="float32", kv_cache_tokens=300000)
built = threads()
engine.generate(input_ids=[[5, 6, 7]], sampling_params={"max_new_tokens": 3, "temperature": 0})
print(count, before, built, threads(), torch.get_num_threads() == count)
engine.shutdown()
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2, reason="needs Linux, 2+ CPUs")
def test_building_an_engine_starts_no_thread_pool_on_the_callers_thread(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder)], cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, before, built, after, restored = proc.stdout.split()[-5:]
    one_pool = int(before) + 1 + (int(count) - 1)  # the engine thread and its workers, nothing more
    assert int(before) + 1 <= int(built) <= one_pool, (count, before, built)
    assert int(built) <= int(after) <= one_pool, (count, before, after)  # serving started no second pool
    assert restored == "True"  # the caller's intra-op thread count is as it was
