"""A GGUF checkpoint served as shipped (`--quantization gguf`, the default where it applies):
the 5-, 6- and 8-bit tensors decode to exactly the gguf package's weights, the converter keeps
them, the layers read them, and the default resolves to gguf only where the CPU serves it well
(decided from forced inputs, so this holds on every CPU kind)."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from kernels.cpu_ops import ops
from runtime import Engine
from runtime.cpu import Precision, prepare
from runtime.cpu.block_linear import BlockEmbedding, BlockLinear, BlockOutputLayer
from runtime.cpu.block_weights import Int4Blocks, Int8Blocks, TorchInt4Blocks
from runtime.cpu.dual_linear import DualLinear
from runtime.cpu.prepare import group_kernel_fast as gguf_fast
from runtime.cpu.prepare import resolve_quantization
from runtime.exec.model_runner import ModelRunner, RunnerConfig, load_config, load_model
from runtime.loading.default_model import build_model_dir
from runtime.loading.gguf_groups import read_int4_groups
from runtime.loading.gguf_int8_groups import EIGHT_BIT, INT8_GROUPS_FILE, read_int8_groups, tensor_groups
from runtime.models.weights import checkpoint_files, iterate_weights
from tests.tiny_gguf import write_tiny_gemma3_gguf

prepare_module = importlib.import_module("runtime.cpu.prepare")  # the package re-exports its function `prepare`
needs_kernels = pytest.mark.skipif(ops() is None, reason="the CPU kernels could not be built here")
CPU = torch.device("cpu")
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def random_blocks(kind: GGMLQuantizationType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random codes and sub-block scales; the f16 scale finite and of weight-like size."""
    blocks = rng.integers(0, 256, size=(n_blocks, GGML_QUANT_SIZES[kind][1]), dtype=np.uint8)
    at = 208 if kind == GGMLQuantizationType.Q6_K else 0  # where the block's f16 d sits
    d = (rng.standard_normal(n_blocks) * 0.01).astype(np.float16)
    blocks[:, at:at + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    blocks[:3, at:at + 2] = 0  # a few all-zero groups
    return blocks


@pytest.mark.parametrize("kind", EIGHT_BIT, ids=lambda k: k.name)
def test_decoded_groups_are_exactly_the_dequantized_weights(kind: GGMLQuantizationType) -> None:
    rng = np.random.default_rng(int(kind))
    rows, width = 4, 512
    blocks = random_blocks(kind, rows * width // GGML_QUANT_SIZES[kind][0], rng)
    groups = tensor_groups(kind, blocks, (rows, width))
    q6 = kind == GGMLQuantizationType.Q6_K
    assert groups is not None and groups.group == (16 if q6 else 32)
    assert groups.scales.dtype == (torch.float32 if q6 else torch.float16)  # the block's own f16 d where exact
    want = dequantize(blocks.reshape(rows, -1), kind).reshape(rows, width)
    assert np.array_equal(groups.dequantize().numpy(), want)
    assert tensor_groups(GGMLQuantizationType.Q4_K, blocks, (rows, width)) is None  # 4-bit: runtime/loading/gguf_groups.py


@pytest.fixture(scope="module")
def mixed_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("gguf-mixed")
    expected = write_tiny_gemma3_gguf(tmp / "tiny.gguf", mixed=True)
    # as a user's GGUF is converted: the quantized tensors kept only as their codes
    return build_model_dir(tmp / "tiny.gguf", tmp / "model", progress=False, full=False), expected


def test_converter_keeps_the_8bit_tensors_beside_the_checkpoint(mixed_model: tuple[Path, dict]) -> None:
    folder, expected = mixed_model
    groups = read_int8_groups(folder)
    four_bit = ("o_proj.weight", "down_proj.weight")
    assert sorted(groups) == sorted(n for n, w in expected.items() if w.ndim == 2 and not n.endswith(four_bit))
    for name, g in groups.items():
        assert np.array_equal(g.dequantize().numpy(), expected[name])
    assert [p.name for p in checkpoint_files(folder)] == ["model.safetensors"]  # not taken for a shard
    # no second, dequantized copy of a kept tensor on disk; loaders that want one get it exact
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        assert not set(handle.keys()) & (set(groups) | set(read_int4_groups(folder)))
    weights = dict(iterate_weights(folder))
    assert set(weights) == set(expected)
    for name, w in weights.items():
        assert np.array_equal(w.numpy(), expected[name]), name


@pytest.mark.parametrize(("fast", "dtype", "files", "load_format", "want"), [
    (True, torch.bfloat16, True, "auto", "gguf"),
    (False, torch.bfloat16, True, "auto", None),  # no vector loop: slower than the dequantized weights
    (True, torch.float32, True, "auto", "gguf"),  # fp32 activations (no bf16 units): the codes still serve
    (True, torch.float16, True, "auto", None),
    (True, torch.bfloat16, False, "auto", None),  # not converted from a GGUF
    (True, torch.bfloat16, True, "dummy", None),
])
def test_the_default_serves_the_shipped_weights_only_where_it_pays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool, dtype: torch.dtype, files: bool,
        load_format: str, want: str | None) -> None:
    monkeypatch.setattr(prepare_module, "group_kernel_fast", lambda: fast)
    if files:
        (tmp_path / INT8_GROUPS_FILE).write_bytes(b"")
    assert resolve_quantization(None, CPU, dtype, tmp_path, load_format) == want
    assert resolve_quantization("none", CPU, dtype, tmp_path, load_format) is None
    assert resolve_quantization(None, torch.device("meta"), dtype, tmp_path, load_format) is None


def test_gguf_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare_module, "cpu_ops", lambda: object())  # as if built: holds where no compiler is
    with pytest.raises(ValueError, match="converted from a GGUF"):
        resolve_quantization("gguf", CPU, torch.bfloat16, tmp_path, "auto")
    (tmp_path / INT8_GROUPS_FILE).write_bytes(b"")
    with pytest.raises(ValueError, match="bf16 or fp32 activations"):
        resolve_quantization("gguf", CPU, torch.float16, tmp_path, "auto")
    with pytest.raises(ValueError, match="for the CPU"):
        resolve_quantization("gguf", torch.device("meta"), torch.bfloat16, tmp_path, "auto")
    assert resolve_quantization("gguf", CPU, torch.float32, tmp_path, "auto") == "gguf"
    with pytest.raises(ValueError, match="quantization must be gguf, int8, int4, none or unset"):
        Engine(model=str(tmp_path), quantization="q4_k_m")


def _parts(runner: ModelRunner) -> dict[str, list[type]]:
    return {name: [type(p) for p in m.parts] for name, m in runner.model.named_modules() if isinstance(m, BlockLinear)}


@needs_kernels
def test_gguf_serves_every_layer_from_its_shipped_codes(mixed_model: tuple[Path, dict]) -> None:
    folder, expected = mixed_model
    runner = ModelRunner(RunnerConfig(folder, dtype="bfloat16", num_slots=64, max_requests=2, max_context=32,
                                      quantization="gguf"))
    assert runner.quantization == "gguf"
    parts = _parts(runner)
    layers = [f"model.layers.{i}" for i in range(2)]
    four = {Int4Blocks, TorchInt4Blocks}  # which one depends on the CPU (AVX-512) and the width
    assert {n for n, kinds in parts.items() if set(kinds) <= four} == {f"{p}.{s}" for p in layers
                                                                        for s in ("self_attn.o_proj", "mlp.down_proj")}
    # q, k (Q5_0) and v (Q8_0) fuse into one projection, as do gate and up: one group size each
    assert {n for n, kinds in parts.items() if kinds == [Int8Blocks]} == {
        f"{p}.{s}" for p in layers for s in ("self_attn.qkv_proj", "mlp.gate_up_proj")}
    assert isinstance(runner.model.model.embed_tokens, BlockEmbedding)
    assert isinstance(runner.output_layer, BlockOutputLayer)
    # nothing of the file's quantized weights is held in --dtype: only norms remain parameters
    assert all(p.dim() == 1 for p in runner.model.parameters())
    layer = dict(runner.model.named_modules())["model.layers.0.mlp.gate_up_proj"]
    exact_w = torch.cat([torch.from_numpy(expected[f"model.layers.0.mlp.{p}_proj.weight"]) for p in ("gate", "up")])
    for rows in (3, 40):  # the codes' kernel, and dequantized slices with torch's GEMM
        x = torch.randn(rows, layer.in_features).bfloat16()
        exact = x.float() @ exact_w.t()
        assert (layer(x).float() - exact).norm() < 0.01 * exact.norm()  # exact weights; bf16 rounding of the output
    ids = torch.tensor([[2, 270, 5], [7, 8, 9]])
    embed = torch.from_numpy(expected["model.embed_tokens.weight"])[ids].bfloat16()
    assert torch.equal(runner.model.model.embed_tokens(ids), embed)


@needs_kernels
def test_gguf_engine_generates_near_the_exact_weights(mixed_model: tuple[Path, dict]) -> None:
    """The model as shipped, served two ways: gguf (codes) and fp32 (the exact dequantized
    weights). Their first-token logits stay close, and gguf generates."""
    folder, _ = mixed_model
    prompt = [[2, 270, 271, 272, 273]]
    with Engine(model=str(folder), dtype="bfloat16", quantization="gguf", kv_cache_tokens=128) as engine:
        assert engine.info.quantization == "gguf"
        out = engine.generate(input_ids=prompt, sampling_params=GREEDY)
        assert len(out[0].token_ids) == GREEDY["max_new_tokens"]
        assert (folder / INT8_GROUPS_FILE).is_file()
    # one-row decode logits, gguf codes vs exact fp32 weights
    runners = {q: ModelRunner(RunnerConfig(folder, dtype=d, num_slots=64, max_requests=1, max_context=32,
                                           quantization=q)) for q, d in (("gguf", "bfloat16"), ("none", "float32"))}
    hidden = torch.randn(1, 64)
    logits = {q: r.output_layer(hidden.to(r.dtype), r.model.output_weight).float() for q, r in runners.items()}
    assert (logits["gguf"] - logits["none"]).norm() < 0.02 * logits["none"].norm()


@needs_kernels
def test_gguf_with_fp32_activations_is_the_fp32_model(mixed_model: tuple[Path, dict]) -> None:
    """On CPUs without bf16 units `--dtype auto` is fp32: the codes still serve (the int8 ones with
    exact weights and fp32 sums), and the logits are the fp32 model's up to the order of sums."""
    folder, _ = mixed_model
    runners = {q: ModelRunner(RunnerConfig(folder, dtype="float32", num_slots=64, max_requests=1, max_context=32,
                                           quantization=q)) for q in ("gguf", "none")}
    gguf = runners["gguf"]
    assert gguf.quantization == "gguf" and gguf.dtype == torch.float32
    assert {n: k for n, k in _parts(gguf).items() if k == [Int8Blocks]}  # the int8 codes serve fp32 too
    hidden = torch.randn(1, 64)
    logits = {q: r.output_layer(hidden, r.model.output_weight) for q, r in runners.items()}
    assert torch.allclose(logits["gguf"], logits["none"], rtol=1e-4, atol=1e-4 * logits["none"].abs().max().item())
    prompt = [[2, 270, 271, 272, 273]]
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=128) as engine:
        assert engine.info.quantization == ("gguf" if gguf_fast() else None)
        assert len(engine.generate(input_ids=prompt, sampling_params=GREEDY)[0].token_ids) == GREEDY["max_new_tokens"]


@needs_kernels
def test_gguf_beside_the_dual_layers_of_a_cpu_without_bf16_units(mixed_model: tuple[Path, dict]) -> None:
    """Where `auto` picks fp32 with bf16 copies for few rows (no bf16 units; forced here), a model
    built over the file's codes makes no such copies: the output layer reads the codes."""
    folder, expected = mixed_model
    model = load_model(folder, load_config(folder), torch.float32, CPU, blocks=True)
    output = prepare(model, Precision(torch.float32, lowp_rows=4, reason="forced"), "gguf")
    assert isinstance(output, BlockOutputLayer)
    assert not any(isinstance(m, DualLinear) for m in model.modules())
    layer = dict(model.named_modules())["model.layers.1.self_attn.qkv_proj"]
    exact_w = torch.cat([torch.from_numpy(expected[f"model.layers.1.self_attn.{p}_proj.weight"]) for p in "qkv"])
    # (relative to the whole product: on AVX2 the codes' products take int16-rounded activations,
    # whose error scales with a group's largest activation, not each output's own size)
    for rows in (2, 33):
        x = torch.randn(rows, layer.in_features)
        want = x @ exact_w.t()
        assert (layer(x) - want).norm() <= 1e-4 * want.norm()
    hidden = torch.randn(3, 64)
    exact = hidden @ torch.from_numpy(expected["model.embed_tokens.weight"]).t()
    assert (output(hidden, model.output_weight) - exact).norm() <= 1e-4 * exact.norm()
