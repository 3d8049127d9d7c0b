"""The MoE layer and the pieces around it: grouped experts against a dense reference, each expert
run on its own tokens only, the loader's three spellings of expert tensors, and which layers are
sparse. (Whole-model parity with transformers is test_model_parity.py's qwen3_moe / qwen2_moe.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runtime.layers.moe import SparseMoeBlock, StackedExperts, group_by_expert, route
from runtime.models.weights import load_into

E, H, I, K = 6, 16, 8, 2


def _experts(seed: int = 0) -> StackedExperts:
    torch.manual_seed(seed)
    experts = StackedExperts(E, H, I, "silu")
    with torch.no_grad():
        experts.gate_up_proj.normal_()
        experts.down_proj.normal_()
    return experts


def _dense(experts: StackedExperts, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Every expert over every token, masked by the routing: what grouping must equal."""
    out = torch.zeros_like(x)
    for e in range(E):
        gate, up = F.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, experts.down_proj[e])
        scale = (weights * (ids == e)).sum(dim=-1, keepdim=True)
        out += scale * y
    return out


@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_grouped_experts_equal_every_expert_over_every_token(tokens: int) -> None:
    experts = _experts()
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, H, generator=gen)
    routing = route(torch.randn(tokens, E, generator=gen), K, renormalize=True)
    with torch.no_grad():
        got = experts(x, routing)
    want = _dense(experts, x, routing.weights, routing.experts)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_group_ends_are_the_groups_cumulative_sizes() -> None:
    ids = torch.tensor([[3, 0], [5, 3], [0, 1], [3, 5]])
    groups = group_by_expert(ids, E)
    assert groups.ends.dtype == torch.int32 and groups.counts == [2, 1, 0, 3, 0, 2]
    assert groups.ends.tolist() == torch.tensor(groups.counts).cumsum(0).tolist() == [2, 3, 3, 6, 6, 8]


@pytest.mark.parametrize("biased", [False, True], ids=["stacked", "biased"])
@pytest.mark.parametrize("tokens", [1, 5, 33])
def test_grouped_products_equal_the_host_loop(biased: bool, tokens: int) -> None:
    """The GPU's sync-free path (two torch._grouped_mm calls; torch runs them on the CPU too) gives
    the host loop's output, biases included, with experts that receive no token among them."""
    from functools import partial

    from runtime.layers.activation import clamped_swiglu
    from runtime.layers.biased_experts import BiasedExperts

    torch.manual_seed(tokens)
    experts = BiasedExperts(E, H, I, partial(clamped_swiglu, alpha=1.702, limit=7.0)) if biased else _experts(tokens)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_()
    x = torch.randn(tokens, H)
    routing = route(torch.randn(tokens, E), K, renormalize=True)
    assert not experts.grouped()  # the CPU takes the host loop
    with torch.no_grad():
        want = experts(x, routing)
        got = experts.forward_grouped(x, routing)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-5), (got - want).abs().max()


def record_expert_rows(monkeypatch: pytest.MonkeyPatch, cls: type) -> dict[int, int]:
    """expert id -> how many rows `cls.expert` was run on (filled as the experts run)."""
    seen: dict[int, int] = {}
    original = cls.expert

    def record(self: object, expert: int, rows: torch.Tensor) -> torch.Tensor:
        seen[expert] = rows.shape[0]
        return original(self, expert, rows)

    monkeypatch.setattr(cls, "expert", record)
    return seen


def test_each_expert_runs_on_its_routed_tokens_only(monkeypatch: pytest.MonkeyPatch) -> None:
    experts = _experts()
    ids = torch.tensor([[0, 3], [3, 5], [0, 5], [3, 0]])
    seen = record_expert_rows(monkeypatch, StackedExperts)
    from runtime.layers.moe import Routing

    with torch.no_grad():
        experts(torch.randn(4, H), Routing(torch.full((4, 2), 0.5), ids))
    assert seen == {0: 3, 3: 3, 5: 2}  # experts 1, 2 and 4 got no token and were never run
    groups = group_by_expert(ids, E)
    assert groups.counts == [3, 0, 0, 3, 0, 2] and groups.tokens.tolist() == [0, 2, 3, 0, 1, 3, 1, 2]


def test_routing_normalisation_is_the_familys() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    plain, renormed = route(logits, 2, renormalize=False), route(logits, 2, renormalize=True)
    probs = torch.softmax(logits, dim=-1)[0]
    assert plain.experts.tolist() == [[0, 1]] == renormed.experts.tolist()
    assert torch.allclose(plain.weights[0], probs[:2])
    assert torch.allclose(renormed.weights[0], probs[:2] / probs[:2].sum())


def _block() -> SparseMoeBlock:
    with torch.device("meta"):
        block = SparseMoeBlock(H, E, K, I, "silu", renormalize=False)
    return block.to_empty(device="cpu")


def test_expert_tensors_load_from_each_spelling() -> None:
    gen = torch.Generator().manual_seed(0)
    gate, up = torch.randn(E, I, H, generator=gen), torch.randn(E, I, H, generator=gen)
    down, router = torch.randn(E, H, I, generator=gen), torch.randn(E, H, generator=gen)
    per_expert = [("gate.weight", router)] + [
        (f"experts.{e}.{name}.weight", t[e]) for e in range(E) for name, t in
        (("gate_proj", gate), ("up_proj", up), ("down_proj", down))]
    stacked = [("gate.weight", router), ("experts.gate_up_proj", torch.cat([gate, up], dim=1)),
               ("experts.down_proj", down)]
    per_projection = [("gate.weight", router), ("experts.gate_proj", gate), ("experts.up_proj", up),
                      ("experts.down_proj", down)]
    loaded = []
    for weights in (per_expert, stacked, per_projection):
        block = _block()
        load_into(block, iter(weights))
        loaded.append(block)
    for block in loaded:
        assert torch.equal(block.experts.gate_up_proj[:, :I], gate)
        assert torch.equal(block.experts.gate_up_proj[:, I:], up)
        assert torch.equal(block.experts.down_proj, down) and torch.equal(block.gate.weight, router)
    with pytest.raises(ValueError, match="lacks tensors.*gate_up_proj"):
        load_into(_block(), iter([w for w in per_expert if w[0] != "experts.4.up_proj.weight"]))


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers() -> None:
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    from runtime.models.qwen_moe import Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=6,
                            num_attention_heads=2, num_key_value_heads=1, moe_intermediate_size=8,
                            shared_expert_intermediate_size=8, num_experts=4, num_experts_per_tok=2,
                            decoder_sparse_step=2, mlp_only_layers=[3])
    config.architectures = ["Qwen2MoeForCausalLM"]
    with torch.device("meta"):
        ours = Qwen2MoeForCausalLM(config)
        ref = AutoModelForCausalLM.from_config(config)
    sparse = [isinstance(layer.mlp, SparseMoeBlock) for layer in ours.model.layers]
    assert sparse == [hasattr(layer.mlp, "experts") for layer in ref.model.layers] == [
        False, True, False, False, False, True]
    # and the parameter names match the checkpoint's, expert stacks aside
    ours_names = {n for n, _ in ours.named_parameters() if ".experts." not in n}
    fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj"}
    ref_names = {re.sub(r"\.(q|k|v|gate|up)_proj\.", lambda m: f".{fused[m[0][1:-1]]}.", n)
                 for n, _ in ref.named_parameters() if ".experts." not in n}
    assert ours_names == ref_names


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_moe_model_serves_in_bf16_with_int8_linears_and_dummy_weights(family: str, tmp_path: Path) -> None:
    """The CPU's preparation (packed / int8 linears) leaves the stacked experts and routers alone, and
    the engine serves the model in fp32, bf16, with int8 linears, and from random weights."""
    from runtime import Engine
    from tests.tiny_models import save_tiny_model

    folder = save_tiny_model(family, tmp_path)
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    prompt = [list(range(5, 25))]
    outs = {}
    for name, kwargs in {"fp32": dict(dtype="float32"), "bf16": dict(dtype="bfloat16"),
                         "int8": dict(dtype="bfloat16", quantization="int8"),
                         "dummy": dict(dtype="bfloat16", load_format="dummy")}.items():
        with Engine(model=str(folder), kv_cache_tokens=256, **kwargs) as engine:
            outs[name] = engine.generate(input_ids=prompt, sampling_params=params)[0].token_ids
    assert all(len(tokens) == 6 for tokens in outs.values()), outs
