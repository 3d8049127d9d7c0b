"""The engine is device-correct: every tensor of the step path names its device, and devices resolve clearly.

No GPU is needed for these. With "meta" as torch's default device inside the engine's steps, a
tensor made without an explicit device is a meta tensor, and the first op that meets it with a
real tensor fails: so passing here means the step path would not silently build CPU tensors
that a GPU op then reads (the bug class that breaks on CUDA). `make test-gpu` runs the same
engine on CUDA (tests/runtime/exec/test_gpu_engine.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from runtime import Engine
from runtime.cpu.precision import choose
from runtime.exec.device import resolve_device
from tests.runtime.engine_helpers import assert_slots_balanced, shared_prefix_prompts
from tests.tiny_models import save_tiny_model, tiny_config

PARAMS = [
    {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
    {"max_new_tokens": 6, "temperature": 0.8, "top_p": 0.9, "top_k": 20, "min_p": 0.01, "seed": 3,
     "ignore_eos": True},
    {"max_new_tokens": 6, "temperature": 0.7, "repetition_penalty": 1.3, "frequency_penalty": 0.5,
     "presence_penalty": 0.2, "ignore_eos": True, "return_logprob": True, "top_logprobs_num": 3},
    {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "return_logprob": True, "logprob_start_len": 2},
    {"max_new_tokens": 0, "temperature": 0},
    {"max_new_tokens": 5, "temperature": 1.0, "seed": 11, "ignore_eos": True},
    {"max_new_tokens": 12, "temperature": 0.5, "seed": 4, "regex": "(yes|no)[0-9]{2}"},
]


def _run(folder: Path, meta_default: bool, **engine_args: object) -> list:
    with Engine(model=str(folder), dtype="float32", **{"kv_cache_tokens": 128, **engine_args}) as engine:
        if meta_default:  # the step's two halves: launch (forward, sample) and complete (process)
            for name in ("_launch", "_complete"):
                original = getattr(engine.loop, name)

                def on_meta(arg, original=original):  # noqa: ANN001, ANN202
                    with torch.device("meta"):
                        return original(arg)

                setattr(engine.loop, name, on_meta)
        outs = engine.generate(input_ids=shared_prefix_prompts() + [[5, 6, 7]], sampling_params=PARAMS)
        assert_slots_balanced(engine)
    return outs


@pytest.mark.parametrize("extra", [{}, {"page_size": 4, "chunked_prefill_size": 5, "kv_cache_tokens": 48}])
def test_step_path_names_every_device(tmp_path: Path, extra: dict) -> None:
    folder = save_tiny_model("gemma3", tmp_path)
    want = _run(folder, meta_default=False, **extra)
    got = _run(folder, meta_default=True, **extra)
    assert [o.error for o in got] == [None] * len(got)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    # Arrival timing may batch the prompts differently between runs: same values up to fp32 rounding.
    for g, w in zip(got, want):
        assert (g.logprobs is None) == (w.logprobs is None)
        if g.logprobs is not None:
            for field in ("input_token_logprobs", "output_token_logprobs"):
                gv, wv = getattr(g.logprobs, field), getattr(w.logprobs, field)
                assert [t for _, t in gv] == [t for _, t in wv]
                assert [v for v, _ in gv] == pytest.approx([v for v, _ in wv], abs=1e-4)


def test_device_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error seen without CUDA")
def test_cuda_without_cuda_fails_at_startup_with_one_clear_line(tmp_path: Path) -> None:
    folder = save_tiny_model("llama", tmp_path)
    with pytest.raises(RuntimeError, match=r"--device cuda: CUDA is not available here.*use --device cpu"):
        Engine(model=str(folder), device="cuda")


def test_dummy_load_format_needs_only_a_config(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tiny_config("gemma3").to_dict()
    config["architectures"] = ["Gemma3ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        with Engine(model=str(tmp_path), load_format="dummy", kv_cache_tokens=64) as engine:
            out = engine.generate(input_ids=[[2, 5, 7, 9]], sampling_params={"max_new_tokens": 5, "temperature": 0,
                                                                             "ignore_eos": True})[0]
            params = list(engine.runner.model.parameters())
            precision = engine.runner.precision
    assert len(out.token_ids) == 5 and out.error is None
    assert "RANDOM weights" in caplog.text
    # auto measured this CPU and chose from its rates (bf16 with bf16 units, fp32 without): the
    # weights are in the dtype those rates call for, whatever kind of CPU runs the test.
    assert precision.rates is not None and precision.dtype == choose(precision.rates).dtype
    assert all(p.dtype == precision.dtype for p in params)
    assert all(p.float().std() > 0 for p in params if p.numel() > 1)  # never zeros
    with pytest.raises(FileNotFoundError):  # never chosen implicitly: a config alone does not load
        Engine(model=str(tmp_path), kv_cache_tokens=64)


def test_kv_pool_is_sized_after_the_weights(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = save_tiny_model("qwen3", tmp_path)
    with caplog.at_level(logging.INFO, logger="runtime.exec.model_runner"):
        with Engine(model=str(folder), kv_cache_memory_fraction=0.001, max_kv_cache_tokens=5000, page_size=4) as e:
            slots = e.runner.num_slots
    assert 0 < slots <= 5000 and slots % 4 == 0
    assert "weights" in caplog.text and "KV pool" in caplog.text and f"= {slots} tokens" in caplog.text
