"""A GGUF's own 4-bit tensors served as int4 as shipped (runtime/loading/gguf_groups.py): the decoders
agree with the gguf package's dequantizer bit for bit, the converter keeps the groups, and
`--quantization int4` serves those layers from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from runtime import Engine
from runtime.cpu.int4_linear import INT4_MAX_ROWS, Int4Linear
from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.loading.default_model import build_model_dir
from runtime.loading.gguf_groups import FOUR_BIT, INT4_GROUPS_FILE, decode_blocks, read_int4_groups, tensor_groups
from runtime.models.weights import checkpoint_files
from tests.tiny_gguf import write_tiny_gemma3_gguf


def random_blocks(kind: GGMLQuantizationType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random codes and 6-bit scales; the f16 fields finite and of weight-like size."""
    blocks = rng.integers(0, 256, size=(n_blocks, GGML_QUANT_SIZES[kind][1]), dtype=np.uint8)
    halves = 2 if kind == GGMLQuantizationType.Q4_0 else 4  # bytes of f16 fields at the start
    f16 = (rng.standard_normal((n_blocks, halves // 2)) * 0.01).astype(np.float16)
    blocks[:, :halves] = f16.view(np.uint8).reshape(n_blocks, halves)
    return blocks


@pytest.mark.parametrize("kind", FOUR_BIT, ids=lambda k: k.name)
def test_decoded_groups_are_exactly_the_dequantized_weights(kind: GGMLQuantizationType) -> None:
    rng = np.random.default_rng(int(kind))
    rows, width = 6, 512
    per_block = GGML_QUANT_SIZES[kind][0]  # weights
    blocks = random_blocks(kind, rows * width // per_block, rng)
    codes, scales, lows = decode_blocks(kind, blocks)
    assert codes.min() >= 0 and codes.max() <= 15
    groups = tensor_groups(kind, blocks, (rows, width))
    want = dequantize(blocks.reshape(rows, -1), kind).reshape(rows, width)
    assert np.array_equal(groups.dequantize().numpy(), want)
    assert decode_blocks(GGMLQuantizationType.Q5_0, blocks) is None  # not 4-bit: quantized at load instead


@pytest.fixture(scope="module")
def four_bit_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("gguf4")
    expected = write_tiny_gemma3_gguf(tmp / "tiny.gguf", four_bit=True)
    return build_model_dir(tmp / "tiny.gguf", tmp / "model", progress=False), expected


def test_converter_keeps_the_4bit_tensors_beside_the_checkpoint(four_bit_model: tuple[Path, dict]) -> None:
    folder, expected = four_bit_model
    groups = read_int4_groups(folder)
    assert sorted(groups) == sorted(n for n in expected if n.endswith(("o_proj.weight", "down_proj.weight")))
    for name, g in groups.items():
        assert np.array_equal(g.dequantize().numpy(), expected[name])
    assert [p.name for p in checkpoint_files(folder)] == ["model.safetensors"]  # not taken for a shard


def test_int4_serves_the_shipped_codes(four_bit_model: tuple[Path, dict]) -> None:
    folder, expected = four_bit_model
    runner = ModelRunner(RunnerConfig(folder, dtype="bfloat16", num_slots=64, max_requests=2, max_context=32,
                                      quantization="int4"))
    layers = {name: m for name, m in runner.model.named_modules() if isinstance(m, Int4Linear)}
    shipped = {name for name, m in layers.items() if m.shipped}
    assert shipped == {name.removesuffix(".weight") for name in read_int4_groups(folder)}
    name = sorted(shipped)[0]
    x = torch.randn(INT4_MAX_ROWS, layers[name].in_features).bfloat16()
    exact = x.float() @ torch.from_numpy(expected[f"{name}.weight"]).t()
    # as shipped: only bf16 rounding of activations, scales and offsets, far below a 4-bit step
    assert (layers[name](x).float() - exact).abs().max() < 0.02 * exact.abs().max()
    with Engine(model=str(folder), dtype="bfloat16", quantization="int4", kv_cache_tokens=128) as engine:
        out = engine.generate(input_ids=[[2, 270, 271]], sampling_params={"max_new_tokens": 4, "temperature": 0,
                                                                        "ignore_eos": True})
        assert len(out[0].token_ids) == 4
    assert (folder / INT4_GROUPS_FILE).is_file()
