"""A mixture's routers on the CPU (runtime/cpu/routers.py): the CPU's preparation gives every bf16
router a float32 copy of its weight, the logits are then float32 sums of the same exact products
rounded once to bf16 (what a bf16 product gives, up to the order of its sums), and the routing a
bf16 model chooses matches the bf16 product's; float32 routers are left alone."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.cpu.routers import float_routers
from runtime.layers.moe import Router, route


def router(dtype: torch.dtype, outputs: int = 128, hidden: int = 2048, bias: bool = False) -> Router:
    r = Router(hidden, outputs, bias=bias)
    with torch.no_grad():
        r.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
        if r.bias is not None:
            r.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    return r.to(dtype)


def test_the_logits_are_float32_sums_rounded_once() -> None:
    for bias in (False, True):
        r = router(torch.bfloat16, bias=bias)
        x = torch.randn(5, 2048, generator=torch.Generator().manual_seed(2)).bfloat16()
        bf16 = r(x)
        assert float_routers(r) == 1 and r.float_weight is not None and r.float_weight.dtype == torch.float32
        assert (r.float_bias is None) == (r.bias is None)
        fast = r(x)
        assert fast.dtype == torch.bfloat16
        exact = F.linear(x.double(), r.weight.double(), None if r.bias is None else r.bias.double())
        # one bf16 rounding of a float32 sum (2048 exact products) away from the exact logits
        assert torch.allclose(fast.float(), exact.float(), rtol=2 ** -8, atol=1e-5)
        # the bf16 product's logits: the same numbers up to one bf16 rounding of a differently ordered sum
        assert torch.allclose(fast.float(), bf16.float(), rtol=1e-2, atol=1e-2 * bf16.float().abs().max().item())


def test_the_routing_matches_the_bf16_products() -> None:
    r = router(torch.bfloat16)
    x = torch.randn(64, 2048, generator=torch.Generator().manual_seed(3)).bfloat16()
    want = route(r(x), 8, renormalize=True)
    float_routers(r)
    got = route(r(x), 8, renormalize=True)
    same = (got.experts.sort(dim=-1).values == want.experts.sort(dim=-1).values).all(dim=-1)
    assert same.float().mean() >= 0.95  # a near tie at the 8th place may fall either way


def test_float32_routers_are_left_alone() -> None:
    r = router(torch.float32)
    assert float_routers(r) == 0 and r.float_weight is None


def test_the_cpu_preparation_gives_a_bf16_mixture_float_routers(tmp_path: Path) -> None:
    from runtime import Engine
    from tests.tiny_models import save_tiny_model

    folder = save_tiny_model("qwen2_moe", tmp_path)  # routers and the shared expert's gate
    with Engine(model=str(folder), kv_cache_tokens=256, dtype="bfloat16") as engine:
        model = engine.loop.runner.model
        routers = [m for m in model.modules() if isinstance(m, Router)]
        assert routers and all(m.float_weight is not None and torch.equal(m.float_weight, m.weight.float())
                               for m in routers)
        out = engine.generate(input_ids=[list(range(5, 25))],
                              sampling_params={"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert len(out[0].token_ids) == 4
