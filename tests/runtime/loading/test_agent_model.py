"""The built-in tool-calling model (Qwen2.5-Coder-0.5B-Instruct from the `agent-model` extra).

Fast: the GGUF parts are found through package metadata and joined only when every SHA-256
matches (checked on small distributions made here, installed on sys.path for real); the
converter reads a qwen2 GGUF by its header and our Qwen2 code matches transformers on it.
Slow (`make test-all`, which installs the extra): the real file converts once, and our logits
match transformers' own GGUF loading of the same file, fp32.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import save_file

from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.loading.builtin_models import (
    BUILTIN_MODELS,
    QWEN2_5_CODER_0_5B_INSTRUCT,
    BuiltinModel,
    BuiltinModelError,
    PackagePart,
    assemble_gguf,
    builtin_model,
)
from runtime.loading.default_model import builtin_model_dir, ensure_builtin_model
from runtime.loading.sources import resolve_model_path
from runtime.loading.gguf_convert import dequantized_state_dict, hf_config
from runtime.step.forward_batch import BatchEntry, ForwardBatch

AGENT = QWEN2_5_CODER_0_5B_INSTRUCT


# -- the table and the package check ---------------------------------------------------------------


def test_names_and_aliases_pick_one_row_each() -> None:
    names = [n for model in BUILTIN_MODELS for n in model.names]
    assert len(names) == len(set(names))
    assert builtin_model("agent") is AGENT and builtin_model("qwen2.5-coder-0.5b-instruct") is AGENT
    assert builtin_model("default").name == "gemma-3-270m"
    assert builtin_model("gpt-4") is None
    assert AGENT.tool_call_parser == "qwen25_coder" and len(AGENT.parts) == 6
    assert [p.version for p in AGENT.parts] == ["0.9.0"] * 6


def _install_fake_distribution(site: Path, name: str, version: str, payload: bytes) -> PackagePart:
    """A real installed distribution (dist-info with METADATA and RECORD) holding one data file."""
    module = name.replace("-", "_")
    rel = f"{module}/data/chunk.bin"
    (site / module / "data").mkdir(parents=True)
    (site / rel).write_bytes(payload)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"{rel},sha256={digest},{len(payload)}\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return PackagePart(name, version, rel, hashlib.sha256(payload).hexdigest())


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[BuiltinModel, Path]:
    site = tmp_path / "site"
    payloads = [b"GGUF" + bytes(range(200)), b"second part" * 50, b"tail"]
    parts = tuple(_install_fake_distribution(site, f"radixserve-test-part{i + 1}", "0.1.0", p)
                  for i, p in enumerate(payloads))
    monkeypatch.syspath_prepend(str(site))
    model = BuiltinModel(name="tiny", aliases=(), title="Tiny test model", parts=parts,
                         sha256=hashlib.sha256(b"".join(payloads)).hexdigest(), install_hint="pip install tiny")
    return model, site


def test_parts_are_found_by_metadata_joined_in_order_and_checked(fake_model: tuple[BuiltinModel, Path],
                                                                 tmp_path: Path) -> None:
    model, site = fake_model
    target = assemble_gguf(model, tmp_path / "joined.gguf")
    expected = b"".join((site / p.file).read_bytes() for p in model.parts)
    assert target.read_bytes() == expected


def test_a_tampered_part_is_named_with_its_version_and_nothing_is_left(fake_model: tuple[BuiltinModel, Path],
                                                                       tmp_path: Path) -> None:
    model, site = fake_model
    (site / model.parts[1].file).write_bytes(b"something else")
    target = tmp_path / "joined.gguf"
    with pytest.raises(BuiltinModelError, match=r"radixserve-test-part2 0\.1\.0 holds unexpected bytes"):
        assemble_gguf(model, target)
    assert not target.exists()


def test_a_wrong_whole_hash_a_missing_or_other_version_package_are_refused(
        fake_model: tuple[BuiltinModel, Path], tmp_path: Path) -> None:
    model, _ = fake_model
    from dataclasses import replace

    with pytest.raises(BuiltinModelError, match="the GGUF joined from radixserve-test-part1 0.1.0.*pins 0000"):
        assemble_gguf(replace(model, sha256="0" * 64), tmp_path / "a.gguf")
    other = replace(model, parts=(replace(model.parts[0], version="0.2.0"), *model.parts[1:]))
    with pytest.raises(BuiltinModelError, match="radixserve-test-part1 0.1.0 is installed; radixserve pins 0.2.0"):
        assemble_gguf(other, tmp_path / "b.gguf")
    missing = replace(model, parts=(PackagePart("radixserve-no-such-part", "1.0", "x/y.bin", "0" * 64),))
    with pytest.raises(BuiltinModelError, match=r"radixserve-no-such-part==1.0 is not installed.*pip install tiny"):
        assemble_gguf(missing, tmp_path / "c.gguf")
    assert not list(tmp_path.glob("*.gguf"))


# -- a tiny qwen2 GGUF through the converter and our Qwen2 code --------------------------------------

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 128, 2, 4, 2, 96


def _write_tiny_qwen2_gguf(path: Path) -> None:
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    head = HIDDEN // HEADS

    def tensor(name: str, shape: tuple[int, ...], quant: bool = True) -> None:
        data = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if quant:
            packed = quantize(data, GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, data)

    tensor("token_embd.weight", (VOCAB, HIDDEN))
    tensor("output.weight", (VOCAB, HIDDEN))
    tensor("output_norm.weight", (HIDDEN,), quant=False)
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_q.weight", (HEADS * head, HIDDEN))
        tensor(f"blk.{i}.attn_k.weight", (KV_HEADS * head, HIDDEN))
        tensor(f"blk.{i}.attn_v.weight", (KV_HEADS * head, HIDDEN))
        tensor(f"blk.{i}.attn_q.bias", (HEADS * head,), quant=False)
        tensor(f"blk.{i}.attn_k.bias", (KV_HEADS * head,), quant=False)
        tensor(f"blk.{i}.attn_v.bias", (KV_HEADS * head,), quant=False)
        tensor(f"blk.{i}.attn_output.weight", (HIDDEN, HEADS * head))
        tensor(f"blk.{i}.attn_norm.weight", (HIDDEN,), quant=False)
        tensor(f"blk.{i}.ffn_norm.weight", (HIDDEN,), quant=False)
        tensor(f"blk.{i}.ffn_gate.weight", (FFN, HIDDEN))
        tensor(f"blk.{i}.ffn_up.weight", (FFN, HIDDEN))
        tensor(f"blk.{i}.ffn_down.weight", (HIDDEN, FFN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _our_logits(folder: Path, prompts: list[list[int]], quantization: str | None = None) -> list[torch.Tensor]:
    runner = ModelRunner(RunnerConfig(folder, dtype="float32", num_slots=1024, max_requests=len(prompts),
                                      max_context=256, quantization=quantization))
    out = []
    for i, ids in enumerate(prompts):
        row = runner.table.alloc_row()
        runner.table.write(row, 0, torch.arange(i * 256, i * 256 + len(ids)))
        out.append(runner.forward(ForwardBatch.build([BatchEntry(row, 0, ids, logits_from=0)], runner.table)))
    return out


def test_the_header_decides_qwen2_and_our_code_matches_transformers(tmp_path: Path) -> None:
    gguf_path = tmp_path / "tiny-qwen2.gguf"
    _write_tiny_qwen2_gguf(gguf_path)
    reader = GGUFReader(str(gguf_path))
    config = hf_config(reader)
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is False
    state = dequantized_state_dict(reader, progress=False)
    assert "model.layers.1.self_attn.k_proj.bias" in state
    assert "model.layers.0.post_attention_layernorm.weight" in state  # qwen2's ffn_norm
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    from transformers import AutoModelForCausalLM

    ids = [3, 17, 42, 5, 88, 9, 60, 61, 2, 33]
    ref_model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert type(ref_model).__name__ == "Qwen2ForCausalLM"
    with torch.no_grad():
        want = ref_model(torch.tensor([ids])).logits[0]
    (ours,) = _our_logits(folder, [ids])
    assert (ours - want).abs().max() < 1e-4


# -- the real model (slow; needs `pip install -e '.[agent-model]'`) -----------------------------------

PARITY_PROMPTS = [
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 37 times 41?<|im_end|>\n<|im_start|>assistant\n",
    "The capital of France is",
]


def _agent_model_installed() -> bool:
    try:
        return all(importlib.metadata.version(p.distribution) == p.version for p in AGENT.parts)
    except importlib.metadata.PackageNotFoundError:
        return False


needs_agent_model = pytest.mark.skipif(not _agent_model_installed(),
                                       reason="needs the agent-model extra: pip install -e '.[agent-model]'")


@pytest.mark.slow
@needs_agent_model
def test_real_agent_model_converts_once_with_its_tool_template() -> None:
    folder = ensure_builtin_model(AGENT)
    assert resolve_model_path("agent") == folder == builtin_model_dir(AGENT)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_hidden_layers"] == 24
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools, tokenize=False,
                                   add_generation_prompt=True)
    assert "<tools>" in text and "<tool_call>" in text and text.endswith("<|im_start|>assistant\n")
    assert tok.convert_tokens_to_ids(["<|im_end|>", "<tool_call>"]) == [151645, 151657]


@pytest.mark.slow
@needs_agent_model
def test_real_agent_model_logits_match_transformers_gguf_loading(tmp_path: Path) -> None:
    """The oracle is transformers reading the same GGUF itself (its own dequantization and names)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_builtin_model(AGENT)
    gguf_path = assemble_gguf(AGENT, tmp_path / "agent.gguf")
    tok = AutoTokenizer.from_pretrained(str(folder))
    prompts = [tok(p, add_special_tokens=False).input_ids for p in PARITY_PROMPTS]
    ours = _our_logits(folder, prompts, "none")  # the file's weights dequantized exactly
    served = _our_logits(folder, prompts)  # from the file's codes (gguf): 4-bit scales held in float16
    ref_model = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=gguf_path.name,
                                                     dtype=torch.float32).eval()
    for ids, got, codes in zip(prompts, ours, served):
        with torch.no_grad():
            want = ref_model(torch.tensor([ids])).logits[0]
        assert (got - want).abs().max() < 1e-3  # measured: at most 5.8e-05 (logits up to 32)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        assert (codes - want).abs().max() < 5e-2  # measured: at most 9.1e-03
