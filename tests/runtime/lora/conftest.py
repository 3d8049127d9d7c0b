"""A tiny base model, three tiny adapters for it and transformers + peft's greedy outputs, shared by the LoRA tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.runtime.engine_helpers import shared_prefix_prompts
from tests.tiny_lora import peft_greedy, save_tiny_adapter
from tests.tiny_models import save_tiny_model

STEPS = 12


@dataclass
class LoraSetup:
    base: Path
    adapters: dict[str, Path]  # name -> PEFT folder
    prompts: list[list[int]]
    want: dict[str | None, list[list[int]]]  # adapter name (None: base) -> greedy outputs of `prompts`


def make_setup(family: str, root: Path, reference: bool = True, names: tuple[str, ...] = ("a", "b", "c"),
               prompt_count: int = 4) -> LoraSetup:
    """Without `reference`, no transformers + peft outputs (`want` is empty): for tests that compare
    the engine with itself. `names`: which of the three adapters; `prompt_count`: how many prompts."""
    base = save_tiny_model(family, root / "base")
    kinds = {
        "a": dict(seed=1),  # every projection, rank 4
        "b": dict(seed=2, targets=["q_proj", "v_proj", "down_proj"], r=8, alpha=16, rslora=True),  # some shards, rsLoRA
        "c": dict(seed=3, targets=["k_proj", "o_proj", "gate_proj", "up_proj"], r=2),
    }
    adapters = {name: save_tiny_adapter(base, root / name, **kinds[name]) for name in names}
    prompts = shared_prefix_prompts()[:prompt_count]
    if not reference:
        return LoraSetup(base, adapters, prompts, {})
    want = {name: peft_greedy(base, path, prompts, STEPS) for name, path in adapters.items()}
    want[None] = peft_greedy(base, None, prompts, STEPS)
    for name in adapters:
        assert want[name] != want[None], f"adapter {name} changes nothing: the test would prove nothing"
    return LoraSetup(base, adapters, prompts, want)


@pytest.fixture(scope="package")
def llama_lora(tmp_path_factory: pytest.TempPathFactory) -> LoraSetup:
    return make_setup("llama", tmp_path_factory.mktemp("lora-llama"))


def lora_paths(setup: LoraSetup, names: tuple[str, ...] = ("a", "b", "c")) -> list[str]:
    return [f"{name}={setup.adapters[name]}" for name in names]


GREEDY = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}


def run_mixed(engine: object, jobs: list[tuple[list[int], str | None]], params: dict | None = None,
              cache_salt: str | None = None) -> list[object]:
    """Submit every (prompt, adapter) at once, so they share steps; their final Outputs, in order."""
    import threading

    done: dict[str, object] = {}
    lock, all_in = threading.Lock(), threading.Event()
    keys: list[str] = []

    def sink(out: object) -> None:
        if out.finished:
            with lock:
                done[out.rid] = out
                if len(done) == len(jobs):
                    all_in.set()

    for prompt, adapter in jobs:
        keys += engine.submit(prompt, params or GREEDY, sink, cache_salt=cache_salt, lora=adapter)
    assert all_in.wait(timeout=300), "requests did not finish"
    return [done[k] for k in keys]


def record_step_adapters(engine: object) -> list[set]:
    """Wrap the runner's step: each step's set of adapter names (None: a base-model row)."""
    seen: list[set] = []
    run = engine.runner.run

    def recording(entries: list, *args: object) -> object:
        seen.append({None if e.lora is None else e.lora.name for e in entries})
        return run(entries, *args)

    engine.runner.run = recording
    return seen
