"""runtime/cpu/timing.best_times: the ways alternate within each round, each keeps its best time,
and the last call's result comes back."""

from __future__ import annotations

from runtime.cpu.timing import best_times


def test_ways_alternate_and_keep_their_best() -> None:
    calls: list[str] = []
    times, last = best_times({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}, rounds=3)
    assert calls == ["a", "b"] * 3
    assert set(times) == {"a", "b"} and all(0 <= t < 1 for t in times.values())
    assert last == 2
