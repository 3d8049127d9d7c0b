"""LoRA over a GGUF's own quantized blocks (`--quantization gguf`, the default for a GGUF on a CPU
whose kernels read it): the adapter's deltas wrap whatever layers serve the codes. In float32 the
products are those of the dequantized model, so greedy output matches transformers + peft on the
converted checkpoint, alone and in a mixed batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import Engine
from runtime.loading.sources import radixserve_home, resolve_model_path
from tests.runtime.engine_helpers import assert_slots_balanced, shared_prefix_prompts
from tests.runtime.lora.conftest import run_mixed
from tests.tiny_gguf import write_tiny_gemma3_gguf
from tests.tiny_lora import peft_greedy, save_tiny_adapter

STEPS = 8


def reference_folder(converted: Path, weights: dict, folder: Path) -> Path:
    """The converted checkpoint with every weight in model.safetensors (the converter keeps the 4-bit
    ones beside it as codes), dequantized as the file's codes say: what transformers + peft load."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(converted, folder)
    state = load_file(str(converted / "model.safetensors"))
    state.update({name: torch.from_numpy(value.copy()) for name, value in weights.items()})
    save_file(state, str(folder / "model.safetensors"))
    return folder


def test_adapters_over_a_gguf_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = radixserve_home() / "cpu-ops"  # shared with this test's own home: no rebuild of the kernels
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    if built.is_dir():
        (tmp_path / "home" / "cpu-ops").symlink_to(built)
    gguf = tmp_path / "tiny.gguf"
    weights = write_tiny_gemma3_gguf(gguf, mixed=True)
    converted = reference_folder(resolve_model_path(str(gguf)), weights, tmp_path / "reference")
    a = save_tiny_adapter(converted, tmp_path / "a", seed=1, std=0.3)  # for the GGUF's own (converted) shapes
    prompts = [[t % 250 + 6 for t in p] for p in shared_prefix_prompts()[:3]]
    want = {"a": peft_greedy(converted, a, prompts, STEPS), None: peft_greedy(converted, None, prompts, STEPS)}
    assert want["a"] != want[None]
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(gguf), dtype="float32", kv_cache_tokens=512, lora_paths=[f"a={a}"]) as engine:
        if engine.info.quantization != "gguf":
            pytest.skip(f"this CPU serves the GGUF as {engine.info.quantization!r}, not from its blocks")
        for name in ("a", None):
            assert [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params, lora=name)] == want[name]
        outs = run_mixed(engine, [(p, n) for n in ("a", None) for p in prompts], params)
        assert [o.token_ids for o in outs] == want["a"] + want[None]
        assert_slots_balanced(engine)
