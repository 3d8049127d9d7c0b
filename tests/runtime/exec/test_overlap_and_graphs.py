"""The overlap scheduler and the padded graph-step, on the CPU: same tokens as the plain step path.

Overlap (step n+1 planned and launched before step n's ids reach the host, its decode tokens read
from step n's sampled ids on the device) is device-agnostic, so it runs here with
`overlap_schedule="on"`. The CUDA-graph step (static packed buffers, batches padded to a captured
size, padding rows on the pad row and pad slot) runs here eagerly: the same function a GPU
captures. Capture and replay themselves are tested by `make test-gpu`
(tests/runtime/exec/test_gpu_engine.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from runtime import Engine
from runtime.exec.graph_runner import DecodeGraphRunner, capture_sizes
from tests.runtime.engine_helpers import assert_slots_balanced, shared_prefix_prompts
from tests.runtime.exec.test_device_placement import PARAMS
from tests.tiny_models import save_tiny_model

CONFIGS = [
    {},
    {"page_size": 4, "chunked_prefill_size": 5, "kv_cache_tokens": 48},  # chunks and forced retraction
    {"enable_prefix_cache": False, "max_running_requests": 3},
]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("gemma3", tmp_path_factory.mktemp("gemma"))


def _generate(folder: Path, graphs: int | None = None, record: list | None = None, **args: object) -> list:
    with Engine(model=str(folder), dtype="float32", **{"kv_cache_tokens": 128, **args}) as engine:
        if graphs:
            engine.runner.graphs = DecodeGraphRunner(engine.runner, graphs, capture=False)
        if record is not None:
            run = engine.runner.run

            def recording(entries, future_ids=None):
                record.append((len(entries), sum(e.future is not None for e in entries)))
                return run(entries, future_ids)

            engine.runner.run = recording
        prompts = shared_prefix_prompts() + [[5, 6, 7]]
        outs = engine.generate(input_ids=prompts, sampling_params=PARAMS)
        # n > 1 and stop strings ride along: each sample is its own request in the same steps.
        outs += engine.generate(input_ids=[prompts[0]], sampling_params={"n": 3, "temperature": 0.9, "seed": 5,
                                                                         "max_new_tokens": 7, "ignore_eos": True})
        assert_slots_balanced(engine)
    return outs


def _same(got: list, want: list) -> None:
    assert [o.error for o in got] == [None] * len(got)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]
    for g, w in zip(got, want):
        if w.logprobs is not None:
            for field in ("input_token_logprobs", "output_token_logprobs"):
                gv, wv = getattr(g.logprobs, field), getattr(w.logprobs, field)
                assert [t for _, t in gv] == [t for _, t in wv]
                assert [v for v, _ in gv] == pytest.approx([v for v, _ in wv], abs=1e-4)


@pytest.mark.parametrize("config", CONFIGS, ids=["plain", "chunks-retraction", "no-cache"])
def test_overlap_gives_the_same_outputs(gemma: Path, config: dict, caplog: pytest.LogCaptureFixture) -> None:
    want = _generate(gemma, overlap_schedule="off", **config)
    record: list = []
    got = _generate(gemma, overlap_schedule="on", record=record, **config)
    _same(got, want)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # no step failed and was retried
    assert any(futures for _, futures in record), "no step ever read its tokens from the previous step's ids"


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_padded_graph_step_gives_the_same_outputs(gemma: Path, overlap: str, caplog: pytest.LogCaptureFixture) -> None:
    want = _generate(gemma, overlap_schedule="off")
    record: list = []
    got = _generate(gemma, graphs=4, overlap_schedule=overlap, record=record)
    _same(got, want)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    sizes = {n for n, _ in record}
    assert {1, 3} & sizes and any(n > 4 for n in sizes), sizes  # padded sizes and the eager fallback both ran


def test_padded_graph_step_on_triton(gemma: Path) -> None:
    """The Triton backend with fixed decode splits (what a captured graph runs), interpreted here."""
    args = {"attention_backend": "triton", "overlap_schedule": "on"}
    prompts = shared_prefix_prompts()[:3]
    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(gemma), dtype="float32", kv_cache_tokens=128, **args) as engine:
        want = [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)]
        engine.runner.graphs = DecodeGraphRunner(engine.runner, 4, capture=False)
        engine.flush_cache()
        got = [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)]
        assert_slots_balanced(engine)
    assert got == want


def test_overlap_abort_and_finish_mid_flight(gemma: Path) -> None:
    """Aborts land while a step is in flight; every slot still comes back and the others finish."""
    with Engine(model=str(gemma), dtype="float32", kv_cache_tokens=128, overlap_schedule="on") as engine:
        seen = threading.Event()
        first: list = []

        def sink(out) -> None:
            first.append(out)
            if len(out.token_ids) >= 2:
                seen.set()

        (rid,) = engine.submit([5, 6, 7, 8], {"max_new_tokens": 50, "temperature": 0, "ignore_eos": True}, sink,
                               stream=True)
        others = engine.generate(input_ids=shared_prefix_prompts()[:4],
                                 sampling_params={"max_new_tokens": 9, "temperature": 0, "ignore_eos": True})
        assert seen.wait(30)
        engine.abort(rid)
        while not (first and first[-1].finished):
            threading.Event().wait(0.01)
        assert first[-1].finish_reason == "abort"
        assert [len(o.token_ids) for o in others] == [9] * 4
        assert_slots_balanced(engine)


def test_overlap_stops_where_the_plain_path_stops(gemma: Path) -> None:
    """A stop found on the host one step late costs a step, never an extra token."""
    prompts = shared_prefix_prompts()
    outs = {}
    for overlap in ("off", "on"):
        with Engine(model=str(gemma), dtype="float32", kv_cache_tokens=128, overlap_schedule=overlap) as engine:
            free = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                                       "ignore_eos": True})
            stop = free[0].token_ids[3]  # a token the first prompt produces: it must end right there
            outs[overlap] = engine.generate(input_ids=prompts, sampling_params={
                "max_new_tokens": 12, "temperature": 0, "stop_token_ids": [stop]})
            assert outs[overlap][0].token_ids == free[0].token_ids[: free[0].token_ids.index(stop) + 1]
            assert_slots_balanced(engine)
    assert [o.token_ids for o in outs["on"]] == [o.token_ids for o in outs["off"]]


def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]


def test_cpu_defaults_and_flags(gemma: Path) -> None:
    with Engine(model=str(gemma), dtype="float32", kv_cache_tokens=64) as engine:
        assert engine.loop.overlap is False and engine.runner.graphs is None  # nothing to hide or capture
    with Engine(model=str(gemma), dtype="float32", kv_cache_tokens=64, overlap_schedule="on",
                disable_overlap_schedule=True) as engine:
        assert engine.loop.overlap is False
    with pytest.raises(ValueError, match="overlap_schedule"):
        Engine(model=str(gemma), overlap_schedule="sometimes")
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        Engine(model=str(gemma), cuda_graph_max_bs=0)


def test_padding_rows_touch_only_the_pad_slot(gemma: Path) -> None:
    """A padded step leaves every real slot but its own requests' untouched."""
    with Engine(model=str(gemma), dtype="float32", kv_cache_tokens=64) as engine:
        runner = engine.runner
        runner.graphs = DecodeGraphRunner(runner, 8, capture=False)
        for k in runner.pool.k:
            k.fill_(3.0)  # a sentinel no computed K equals (the tiny model's pad embedding is zero)
        before = [k.clone() for k in runner.pool.k]
        prompts = [[5, 6, 7], [8, 9, 10], [11, 12, 13]]  # decoded as a batch of 3, padded to 4
        engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 3, "temperature": 0,
                                                            "ignore_eos": True})
        written = set()
        for old, new in zip(before, runner.pool.k):
            written |= set(torch.nonzero((old != new).flatten(1).any(1)).flatten().tolist())
        assert written <= set(range(15)) | {runner.pool.pad_slot}  # 3 x (3 prompt + 2 decoded tokens), the pad
        assert runner.pool.pad_slot in written
