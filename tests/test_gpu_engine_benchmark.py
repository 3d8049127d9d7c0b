"""benchmarks/gpu_engine.py runs end to end (on the CPU here, with a tiny config and small shapes).

The figures it exists for come from the H100 (`make test-gpu` does not run it; benchmarks/gpu_check.sh
does); this keeps the script from rotting between GPU sessions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import gpu_engine
from tests.tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_engine_benchmark_smoke_on_cpu(tmp_path: Path) -> None:
    folder = save_tiny_model("gemma3", tmp_path / "model")
    out = tmp_path / "report.json"
    gpu_engine.main(["--models", str(folder), "--device", "cpu", "--dtype", "float32", "--batches", "1", "3",
                     "--hf-batches", "3", "--prompt-len", "8", "--new-tokens", "5", "--prefill-batch", "4",
                     "--prefill-len", "40", "--eager", "--json", str(out)])
    report = json.loads(out.read_text())
    r = report["models"][str(folder)]
    assert set(r["decode"]) == {"1", "3"}
    for d in r["decode"].values():
        assert d["tok_s"] > 0 and d["steps"] >= 5 and d["host_launch_ms_per_step"] > 0
        assert d["device_busy_ms_per_step"] is None  # no CUDA events on the CPU
    assert r["prefill"]["tok_s"] > 0 and r["decode_eager"]["tok_s"] > 0
    assert r["shared_prefix_cache_on"]["hit_rate"] > 0.3 and r["shared_prefix_cache_off"]["hit_rate"] == 0
    assert r["transformers"]["decode"]["3"]["tok_s"] > 0 and r["speedup_vs_transformers@3"] > 0
    assert "| 3 |" in report["markdown"]


def test_gpu_engine_benchmark_runs_by_path_without_cuda() -> None:
    proc = subprocess.run([sys.executable, "benchmarks/gpu_engine.py", "--help"], cwd=ROOT, capture_output=True, check=False,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "--batches" in proc.stdout
