"""gpt-oss's MoE block against transformers' own modules, with the checkpoint's layout turned into
ours by the loader: the router (bias, top-k of the logits, softmax over the k), the experts (biases,
clamped SwiGLU, interleaved gate/up columns), each expert run on its routed tokens only."""

from __future__ import annotations

import pytest
import torch

from runtime.layers.biased_experts import BiasedExperts
from runtime.models.gpt_oss import GptOssMoe, our_layout
from runtime.models.weights import load_into
from tests.runtime.models.test_moe import record_expert_rows
from tests.tiny_models import tiny_config


def _reference_and_ours() -> tuple[torch.nn.Module, GptOssMoe]:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = tiny_config("gpt_oss")
    torch.manual_seed(0)
    ref = GptOssMLP(config).eval()
    with torch.no_grad():
        for name, param in ref.named_parameters():
            param.normal_(0.0, 1.0 if name == "experts.gate_up_proj" else 0.5)  # past the clamp (7)
    ours = GptOssMoe(config)
    load_into(ours, our_layout(iter(ref.state_dict().items())))
    return ref, ours


@pytest.mark.parametrize("tokens", [1, 5, 23])
def test_moe_block_matches_transformers(tokens: int) -> None:
    ref, ours = _reference_and_ours()
    x = torch.randn(1, tokens, 64, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        want, _ = ref(x)
        got = ours(x[0])
    torch.testing.assert_close(got, want[0], atol=1e-4, rtol=1e-5)  # outputs of tens: float32 rounding


def test_each_expert_runs_on_its_routed_tokens_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _, ours = _reference_and_ours()
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(3))
    seen = record_expert_rows(monkeypatch, BiasedExperts)
    with torch.no_grad():
        chosen = torch.topk(ours.router(x), ours.top_k, dim=-1).indices
        ours(x)
    assert seen == {e: n for e, n in enumerate(torch.bincount(chosen.reshape(-1), minlength=8).tolist()) if n}


def test_one_of_a_ggufs_gate_and_up_biases_is_an_error() -> None:
    with pytest.raises(ValueError, match="only one of a pair of tensors"):
        list(our_layout(iter([("model.layers.0.mlp.experts.gate_proj_bias", torch.zeros(8, 32))])))
