"""benchmarks/peers.py `--interleave`: every system measured once a trial, the order turned each trial."""

from __future__ import annotations

from benchmarks import peer_figures
from benchmarks.peers import markdown, visits


def test_interleaved_visits_measure_each_system_once_a_trial_and_turn_the_order() -> None:
    order = visits(["radixserve", "vllm-cpu-bf16", "llama.cpp"], 4)
    assert len(order) == 12
    for trial in range(4):
        names = [n for t, n in order if t == trial]
        assert sorted(names) == ["llama.cpp", "radixserve", "vllm-cpu-bf16"]
    firsts = [next(n for t, n in order if t == trial) for trial in range(3)]
    assert sorted(firsts) == ["llama.cpp", "radixserve", "vllm-cpu-bf16"]  # none always first
    assert [t for t, _ in order] == sorted(t for t, _ in order)  # trial by trial, not system by system
    assert visits([], 3) == []


def test_medians_are_per_figure_and_the_table_says_how_the_run_was_made() -> None:
    samples = [{"prompt_tok_s": 10.0, "resend_s": 0.5}, {"prompt_tok_s": 30.0, "resend_s": 0.1},
               {"prompt_tok_s": 20.0, "resend_s": 0.3}]
    assert peer_figures.medians(samples) == {"prompt_tok_s": 20.0, "resend_s": 0.3}
    row = {"name": "radixserve", "startup_s": 3.0, "prompt_tok_s": 20.0, "resend_s": 0.3}
    report = {"cpu": "a CPU", "date": "2026-11-28", "trials": 3, "systems": [row], "interleaved": True}
    assert "trials alternating between them" in markdown(report)
    assert "every server alone" in markdown({**report, "interleaved": False})
