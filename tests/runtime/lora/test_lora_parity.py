"""Greedy output through a LoRA adapter is token-identical (fp32) to transformers + peft: alone, and in
mixed batches where the base model and several adapters share every step; cache on and off; over
the families' own module layouts; every KV slot is back afterwards."""

from __future__ import annotations

import pytest

from runtime import Engine
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.runtime.lora.conftest import GREEDY, LoraSetup, lora_paths, make_setup, record_step_adapters, run_mixed

CONFIGS = {"cache": {}, "nocache": {"enable_prefix_cache": False},
           "chunked": {"chunked_prefill_size": 4, "max_prefill_tokens": 8, "page_size": 2}}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_each_adapter_alone_matches_peft(llama_lora: LoraSetup, config: str) -> None:
    s = llama_lora
    with Engine(model=str(s.base), dtype="float32", kv_cache_tokens=1024, lora_paths=lora_paths(s),
                **CONFIGS[config]) as engine:
        for name in ("a", "b", "c", None):
            outs = engine.generate(input_ids=s.prompts, sampling_params=GREEDY, lora=name)
            assert [o.token_ids for o in outs] == s.want[name], name
        assert_slots_balanced(engine)


@pytest.mark.parametrize("config", ["cache", "nocache"])
def test_mixed_batch_matches_peft(llama_lora: LoraSetup, config: str) -> None:
    """Base and three adapters, every prompt under each, all submitted at once."""
    s = llama_lora
    names = [None, "a", "b", "c"]
    jobs = [(p, n) for n in names for p in s.prompts]
    with Engine(model=str(s.base), dtype="float32", kv_cache_tokens=1024, lora_paths=lora_paths(s),
                **CONFIGS[config]) as engine:
        steps = record_step_adapters(engine)
        outs = run_mixed(engine, jobs)
        got = {n: [o.token_ids for o, (_, m) in zip(outs, jobs) if m == n] for n in names}
        assert got == {n: s.want[n] for n in names}
        assert max(len(step) for step in steps) == 4  # the base and all three adapters in one step
        assert_slots_balanced(engine)
        assert all(a.users == 0 for a in engine.lora._held.values())


def test_max_loras_per_batch_limits_each_step(llama_lora: LoraSetup) -> None:
    s = llama_lora
    jobs = [(p, n) for n in ("a", "b", "c") for p in s.prompts[:2]] + [(s.prompts[2], None)]
    with Engine(model=str(s.base), dtype="float32", kv_cache_tokens=1024, lora_paths=lora_paths(s),
                max_loras_per_batch=1) as engine:
        steps = record_step_adapters(engine)
        outs = run_mixed(engine, jobs)
        assert [o.token_ids for o in outs] == [s.want[n][s.prompts.index(p)] for p, n in jobs]
        assert max(len(step - {None}) for step in steps) == 1
        assert_slots_balanced(engine)


@pytest.mark.parametrize("family", ["gemma3", "qwen3", "phi3"])
def test_other_families_mixed(family: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Gemma 3 (the default model's family), Qwen3 (q/k norms) and Phi-3 (its checkpoint fuses q/k/v
    and gate/up itself, as ours do, so PEFT adapts qkv_proj and gate_up_proj whole)."""
    from tests.tiny_lora import peft_greedy, save_tiny_adapter
    from tests.tiny_models import save_tiny_model

    if family != "phi3":
        s = make_setup(family, tmp_path_factory.mktemp(f"lora-{family}"), names=("a", "b"), prompt_count=2)
    else:
        root = tmp_path_factory.mktemp("lora-phi3")
        base = save_tiny_model("phi3", root / "base")
        a = save_tiny_adapter(base, root / "a", seed=1, targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
        prompts = llama_prompts()[:2]
        s = LoraSetup(base, {"a": a}, prompts, {"a": peft_greedy(base, a, prompts, GREEDY["max_new_tokens"]),
                                                None: peft_greedy(base, None, prompts, GREEDY["max_new_tokens"])})
    names = [None, *s.adapters]
    jobs = [(p, n) for n in names for p in s.prompts]
    with Engine(model=str(s.base), dtype="float32", kv_cache_tokens=1024,
                lora_paths=[f"{n}={p}" for n, p in s.adapters.items()]) as engine:
        outs = run_mixed(engine, jobs)
        assert [o.token_ids for o in outs] == [s.want[n][s.prompts.index(p)] for p, n in jobs]
        assert_slots_balanced(engine)


def llama_prompts() -> list[list[int]]:
    from tests.runtime.engine_helpers import shared_prefix_prompts

    return shared_prefix_prompts()[:4]
