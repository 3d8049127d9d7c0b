"""The block layers kept after a GGUF's first start (runtime/cpu/block_cache.py): a later start maps
them and serves the very same weights without decoding or repacking any; a damaged, stale or
unwritable file is built again (or not kept), never served."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch import nn

from kernels.cpu_ops import ops
from runtime import Engine
from runtime.cpu import block_cache
from runtime.cpu.block_linear import BlockEmbedding, BlockLinear
from runtime.exec.model_runner import load_config, load_model
from runtime.loading.default_model import build_model_dir
from tests.tiny_gguf import write_tiny_gemma3_gguf

block_linear = importlib.import_module("runtime.cpu.block_linear")
# the block layers' products run our kernels (as in test_gguf_quantization.py); the kinds they pick
# differ by CPU (AVX-512 or not, bf16 dot products or not), and every kind is kept the same way
pytestmark = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")
CPU = torch.device("cpu")
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_tiny_gemma3_gguf(tmp_path / "tiny.gguf", mixed=True)  # Q5_0, Q8_0, 4-bit and float tensors
    return build_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False, full=False)


def load(folder: Path, dtype: torch.dtype) -> nn.Module:
    return load_model(folder, load_config(folder), dtype, CPU, blocks=True)


def held(model: nn.Module) -> dict[str, list[tuple[str, dict[str, object]]]]:
    """Every block layer's parts: their kind and everything the kind keeps."""
    out = {}
    for name, module in model.named_modules():
        parts = module.parts if isinstance(module, BlockLinear) else [module.weight] if isinstance(module, BlockEmbedding) else None
        if parts is not None:
            out[name] = [(type(p).__name__, {f: getattr(p, f) for f in (*p.kept_tensors, *p.kept_attrs)}) for p in parts]
    return out


def assert_same(a: nn.Module, b: nn.Module) -> None:
    left, right = held(a), held(b)
    assert left.keys() == right.keys() and left
    for name in left:
        for (kind_a, fields_a), (kind_b, fields_b) in zip(left[name], right[name], strict=True):
            assert kind_a == kind_b, name
            for field, value in fields_a.items():
                other = fields_b[field]
                same = torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other
                assert same and (not isinstance(value, torch.Tensor) or value.dtype == other.dtype), (name, field)
    layer = "model.layers.0.mlp.gate_up_proj"
    x = torch.randn(40, 64).to(next(a.parameters()).dtype)
    for rows in (1, 3, 40):  # the kernels over codes, and dequantized slices
        assert torch.equal(dict(a.named_modules())[layer](x[:rows]), dict(b.named_modules())[layer](x[:rows]))


def refuse_building(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a kept layer was built again")

    monkeypatch.setattr(block_linear, "block_weight", refuse)
    monkeypatch.setattr(importlib.import_module("runtime.cpu.block_experts"), "block_weight", refuse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_later_start_maps_the_kept_layers(folder: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load(folder, dtype)
    [kept] = folder.glob("blocks-*.st")
    refuse_building(monkeypatch)
    second = load(folder, dtype)
    assert_same(first, second)
    assert kept.is_file() and list(folder.glob("blocks-*")) == [kept]


def test_a_damaged_file_is_built_again(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load(folder, torch.float32)
    [kept] = folder.glob("blocks-*.st")
    size = kept.stat().st_size
    with open(kept, "r+b") as f:  # truncated, as by a full disk or a killed first start
        f.truncate(size // 2)
    again = load(folder, torch.float32)
    assert_same(first, again)
    assert kept.stat().st_size == size  # written again, whole
    kept.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}   ")  # a header that lies
    assert_same(first, load(folder, torch.float32))
    refuse_building(monkeypatch)
    assert_same(first, load(folder, torch.float32))  # and read from then on


def test_one_file_per_folder_and_an_unwritable_folder_still_serves(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load(folder, torch.float32)
    [fp32] = folder.glob("blocks-*.st")
    load(folder, torch.bfloat16)
    [bf16] = folder.glob("blocks-*.st")  # the other dtype's file replaced it
    assert bf16 != fp32
    bf16.unlink()

    def no_room(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(block_cache, "write_blocks", no_room)
    assert held(load(folder, torch.bfloat16))
    assert not list(folder.glob("blocks-*"))


def test_the_engine_generates_the_same_from_the_kept_layers(folder: Path) -> None:
    prompt = [[2, 270, 271, 272, 273]]
    outs = []
    for _ in range(2):  # the first start builds and keeps the layers; the second maps them
        with Engine(model=str(folder), dtype="bfloat16", quantization="gguf", kv_cache_tokens=128) as engine:
            outs.append(engine.generate(input_ids=prompt, sampling_params=GREEDY)[0].token_ids)
    assert outs[0] == outs[1] and len(outs[0]) == GREEDY["max_new_tokens"]
    assert len(list(folder.glob("blocks-*.st"))) == 1


def test_replicas_starting_together_each_write_a_whole_file(folder: Path) -> None:
    """Two processes' first starts on one folder: each writes its own partial file and renames it
    whole, so the kept file is complete whichever rename comes last."""
    import os
    import subprocess
    import sys

    code = ("import sys, torch; from pathlib import Path; from runtime.exec.model_runner import load_config, load_model; "
            "f = Path(sys.argv[1]); load_model(f, load_config(f), torch.float32, torch.device('cpu'), blocks=True)")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=root, env=env) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert not list(folder.glob("*.partial"))
    [kept] = folder.glob("blocks-*.st")
    first = load(folder, torch.float32)
    kept.unlink()
    assert_same(first, load(folder, torch.float32))  # what the replicas kept is what a build gives


def test_int8_activations_is_an_engine_flag(folder: Path) -> None:
    """--int8-activations reaches the model's block layers (this tiny file has no Q4_K layer, so
    none changes: the Q4_0/Q4_1 ones keep exact activations) and the engine serves as before."""
    outs = []
    for flag in (False, True):
        with Engine(model=str(folder), dtype="bfloat16", quantization="gguf", kv_cache_tokens=128,
                    int8_activations=flag) as engine:
            outs.append(engine.generate(input_ids=[[2, 270, 271]], sampling_params=GREEDY)[0].token_ids)
    assert outs[0] == outs[1] and len(outs[0]) == GREEDY["max_new_tokens"]


@pytest.mark.skipif(ops() is None or not ops().group_gemv_q8_fast(), reason="no AVX2: no int8-activation kernels")
@pytest.mark.parametrize("rounds_to_int16", [False, True], ids=["exact-default", "int16-default"])
def test_int8_activations_keep_their_own_file_of_six_bit_q6_k_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   rounds_to_int16: bool) -> None:
    """A Q6_K file (every matrix 256 wide or more) under --int8-activations: its Q6_K codes are held
    at six bits (block_weights.Int8Blocks.use_int8_activations) and kept so in a file of their own
    (`blocks-q8-*.st`); a later start maps it, building nothing, and serves the same tokens. The
    default start keeps its int8 codes in a file beside it where it takes exact activations, and
    where it rounds them to int16 (the AVX2 default, taken here on any kind) sums them in halves
    over the same six-bit codes (Int8Blocks.use_halves), mapping the same file."""
    from gguf import GGMLQuantizationType
    from safetensors import safe_open
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import runtime.cpu
    from runtime.cpu import block_weights
    from runtime.cpu.block_weights import Int8Blocks
    from tests.tiny_gguf import write_gguf_from_hf
    from tests.tiny_tokenizer import VOCAB_SIZE, save_tiny_tokenizer

    monkeypatch.setattr(runtime.cpu, "int16_activations_default", lambda: rounds_to_int16)
    monkeypatch.setattr(block_weights, "int16_activations_default", lambda: rounds_to_int16)
    monkeypatch.setenv("RADIXSERVE_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    Qwen2ForCausalLM(config).float().save_pretrained(str(tmp_path / "hf"))
    save_tiny_tokenizer(tmp_path / "hf", bos=False)
    gguf = tmp_path / "wide-q6_k.gguf"
    write_gguf_from_hf(tmp_path / "hf", gguf, "qwen2", kinds={"*": GGMLQuantizationType.Q6_K})

    def serve(flag: bool) -> tuple[list[int], list[Int8Blocks]]:
        with Engine(model=str(gguf), dtype="float32", kv_cache_tokens=128, int8_activations=flag) as engine:
            parts = [p for p in block_linear.block_parts(engine.runner.model) if isinstance(p, Int8Blocks)]
            return engine.generate(input_ids=[[5, 268, 269, 270]], sampling_params=GREEDY)[0].token_ids, parts

    default, default_parts = serve(False)
    first, six_parts = serve(True)
    if rounds_to_int16:
        assert default_parts and all(p.codes.dtype == torch.uint8 and p.halves for p in default_parts)
    else:
        assert default_parts and all(p.codes.dtype == torch.int8 and not p.halves for p in default_parts)
    assert six_parts and all(p.codes.dtype == torch.uint8 and p.int8_activations for p in six_parts)
    [kept] = (tmp_path / "home").rglob("blocks-q8-*.st")
    # the exact default's file kept beside it; the halves' is the same file
    assert len([p for p in kept.parent.glob("blocks-*.st") if p != kept]) == (0 if rounds_to_int16 else 1)
    with safe_open(str(kept), framework="pt") as handle:
        assert {handle.get_slice(name).get_dtype() for name in handle.keys() if name.endswith(".codes")} == {"U8"}
    refuse_building(monkeypatch)
    again, _ = serve(True)
    assert again == first and len(first) == GREEDY["max_new_tokens"]
    assert serve(False)[0] == default  # and the default's file still maps
