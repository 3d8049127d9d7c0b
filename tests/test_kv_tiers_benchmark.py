"""benchmarks/kv_tiers.py runs end to end (a tiny model, tiny sizes): its figures come from real runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_model


@pytest.mark.slow  # eight engines one after another: a minute or two
def test_the_tier_benchmark_runs(tmp_path: Path) -> None:
    from benchmarks import kv_tiers

    folder = save_tiny_model("llama", tmp_path / "model")
    out = tmp_path / "tiers.json"
    kv_tiers.main(["--model", str(folder), "--doc-words", "3", "--restart-doc-words", "3", "--docs", "4", "--questions", "6", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["restart"]["restarted_cached_tokens"] > 0
    rag = result["rag"]
    assert rag["host tier"]["hit_rate"] > rag["pool alone"]["hit_rate"]
    assert set(result["no_share"]) == {"tiers off", "host tier", "host + disk tiers"}
