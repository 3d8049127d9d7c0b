"""The engine on CUDA (`make test-gpu`; skipped without a GPU): the CPU suite's guarantees, on the device.

- Greedy tokens identical to transformers for all five families in fp32, through the compiled
  Triton kernels, in every scheduling configuration of the CPU parity test; every slot back.
- The torch attention backend on CUDA too (its masks and gathers live on the device).
- bf16 logits close to transformers' fp32 logits.
- A forward step makes no host sync (CUDA's sync debug mode turns one into an error).
- Seeded sampling is reproducible on the GPU, alone or batched.
- A server on the GPU answers the openai client.
- CUDA graphs and the overlap scheduler: greedy tokens identical with each on or off (fp32), the
  graphs really replay (padded sizes included), and every slot comes back.
- MoE experts in bf16 run as grouped products without a host sync, agree with the per-expert
  loop, and let a Qwen MoE model's decode step be captured and replayed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime import Engine
from runtime.exec.model_runner import ModelRunner, RunnerConfig
from runtime.step.forward_batch import BatchEntry, ForwardBatch
from tests.runtime.engine_helpers import assert_slots_balanced, reference_greedy, shared_prefix_prompts
from tests.runtime.test_engine_parity import CONFIGS, STEPS
from tests.tiny_models import FAMILIES, save_tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list, list]:
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    prompts = shared_prefix_prompts()
    return request.param, folder, prompts, reference_greedy(folder, prompts, STEPS)


def _generate(folder: Path, prompts: list, backend: str, **config: object) -> tuple[list, dict]:
    kwargs = dict(dtype="float32", kv_cache_tokens=1024, max_running_requests=8, device="cuda",
                  attention_backend=backend)
    kwargs.update(config)
    params = {"max_new_tokens": STEPS, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(folder), **kwargs) as engine:
        assert engine.device.type == "cuda" and engine.runner.pool.k[0].is_cuda
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        stats = engine.stats()
        assert_slots_balanced(engine)
    return [o.token_ids for o in outs], stats


def record_replays(graphs) -> list[int]:  # noqa: ANN001
    """The batch sizes the decode graphs replay from now on (filled as they run)."""
    sizes: list[int] = []
    run = graphs.run

    def recording(entries, future_ids):  # noqa: ANN001, ANN202
        sizes.append(len(entries))
        return run(entries, future_ids)

    graphs.run = recording
    return sizes


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_matches_transformers_on_cuda(family: tuple, config: str) -> None:
    _, folder, prompts, want = family
    got, stats = _generate(folder, prompts, "triton", **CONFIGS[config])
    assert got == want
    if config == "tight-kv":
        assert stats["retractions_total"] > 0


def test_torch_backend_on_cuda(family: tuple) -> None:
    _, folder, prompts, want = family
    assert _generate(folder, prompts, "torch")[0] == want


def test_bf16_logits_close_and_no_host_sync(family: tuple) -> None:
    name, folder, prompts, _ = family
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    runner = ModelRunner(RunnerConfig(folder, dtype="bfloat16", num_slots=512, max_requests=8, max_context=256,
                                      device="cuda"))
    rows = [runner.table.alloc_row() for _ in prompts]
    start = 0
    for row, prompt in zip(rows, prompts):
        runner.table.write(row, 0, torch.arange(start, start + len(prompt) + 1))
        start += len(prompt) + 1
    # Prefill all but the last token of the first half, then one mixed step: extends + decodes.
    half = len(prompts) // 2
    runner.forward(ForwardBatch.build([BatchEntry(r, 0, p[:-1]) for r, p in zip(rows[half:], prompts[half:])],
                                      runner.table))
    entries = ([BatchEntry(r, 0, p) for r, p in zip(rows[:half], prompts[:half])]
               + [BatchEntry(r, len(p) - 1, p[-1:]) for r, p in zip(rows[half:], prompts[half:])])
    batch = ForwardBatch.build(entries, runner.table)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = runner.forward(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            want = ref(torch.tensor([prompt])).logits[0, -1]
            got = logits[batch.next_token_rows()[i]].float().cpu()
            # bf16 weights and activations: about 3 significant digits of logits of magnitude ~1-5.
            assert (got - want).abs().max() < 0.15, (name, i, (got - want).abs().max())


def test_seeded_sampling_is_reproducible_on_cuda(tmp_path: Path) -> None:
    folder = save_tiny_model("qwen3", tmp_path)
    seeded = {"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.9, "seed": 1234, "ignore_eos": True}
    other = {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True}
    prompts = shared_prefix_prompts()
    with Engine(model=str(folder), device="cuda", kv_cache_tokens=1024) as engine:
        alone = engine.generate(input_ids=prompts[0], sampling_params=seeded)[0].token_ids
        batched = engine.generate(input_ids=prompts, sampling_params=[seeded] + [other] * (len(prompts) - 1))
        again = engine.generate(input_ids=prompts[0], sampling_params=seeded)[0].token_ids
    assert alone == batched[0].token_ids == again


def test_constrained_decoding_on_cuda(tmp_path: Path) -> None:
    import json
    import re

    folder = save_tiny_model("gemma3", tmp_path)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"]}
    with Engine(model=str(folder), device="cuda", kv_cache_tokens=1024) as engine:
        outs = engine.generate(input_ids=[[2, 5, 6, 7]] * 2, sampling_params=[
            {"regex": r"(yes|no) [0-9]{2}", "max_new_tokens": 20, "temperature": 0.8, "seed": 1, "n": 4},
            {"json_schema": json.dumps(schema), "max_new_tokens": 30, "temperature": 0}])
        assert_slots_balanced(engine)
    assert all(re.fullmatch(r"(yes|no) [0-9]{2}", o.text) for o in outs[:4])
    assert 0 <= json.loads(outs[4].text)["n"] <= 99


def test_server_on_cuda_answers_the_openai_client(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    from tests.server.harness import serve

    folder = save_tiny_model("llama", tmp_path)
    with Engine(model=str(folder), device="cuda", kv_cache_tokens=2048) as engine:
        with serve(engine, served_model_name="tiny") as server:
            import httpx

            info = httpx.get(server.url + "/get_server_info").json()
            assert info["device"].startswith("cuda") and info["dtype"] == "bfloat16"
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
            out = client.completions.create(model="tiny", prompt="hello world", max_tokens=8, temperature=0)
            assert out.usage.completion_tokens > 0
            chunks = list(client.completions.create(model="tiny", prompt="hello world", max_tokens=8,
                                                    temperature=0, stream=True))
            assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("overlap", ["on", "off"])
def test_graphs_and_overlap_give_the_same_greedy_tokens(family: tuple, graphs: bool, overlap: str) -> None:
    _, folder, prompts, want = family
    got, _ = _generate(folder, prompts, "triton", disable_cuda_graph=not graphs, overlap_schedule=overlap)
    assert got == want


def test_decode_graphs_replay_with_padding(tmp_path: Path) -> None:
    folder = save_tiny_model("gemma3", tmp_path)
    prompts = shared_prefix_prompts()[:5]  # decodes as 5, then fewer: padded to 8 and smaller sizes
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(folder), dtype="float32", device="cuda", kv_cache_tokens=1024, disable_cuda_graph=True,
                overlap_schedule="off") as engine:
        want = [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)]
    with Engine(model=str(folder), dtype="float32", device="cuda", kv_cache_tokens=1024, max_running_requests=16,
                cuda_graph_max_bs=16) as engine:
        graphs = engine.runner.graphs
        assert graphs is not None and graphs.sizes == [1, 2, 4, 8, 16] and engine.loop.overlap
        assert all(graphs.steps[s].graph is not None for s in graphs.sizes)
        sizes = record_replays(graphs)
        got = [o.token_ids for o in engine.generate(input_ids=prompts, sampling_params=params)]
        assert_slots_balanced(engine)
    assert got == want
    assert 5 in sizes  # a batch of 5 replayed the graph of 8


def test_torch_backend_on_cuda_runs_eagerly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = save_tiny_model("llama", tmp_path)
    with Engine(model=str(folder), device="cuda", kv_cache_tokens=256, attention_backend="torch") as engine:
        assert engine.runner.graphs is None
    assert "CUDA graphs are off" in caplog.text


@pytest.mark.parametrize("biased", [False, True], ids=["stacked", "biased"])
def test_grouped_experts_match_the_host_loop_on_cuda(biased: bool) -> None:
    """bf16 expert stacks on CUDA take the grouped products (no host sync); they agree with the
    host loop's per-expert products on the same weights and routing."""
    from functools import partial

    from runtime.layers.activation import clamped_swiglu
    from runtime.layers.biased_experts import BiasedExperts
    from runtime.layers.moe import StackedExperts, route, runs_grouped

    torch.manual_seed(0)
    e, h, i = 8, 64, 32
    experts = (BiasedExperts(e, h, i, partial(clamped_swiglu, alpha=1.702, limit=7.0)) if biased
               else StackedExperts(e, h, i, "silu")).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(std=0.2)
        x = torch.randn(37, h, device="cuda", dtype=torch.bfloat16)
        routing = route(torch.randn(37, e, device="cuda", dtype=torch.bfloat16), 2, renormalize=True)
        assert runs_grouped(experts.gate_up_proj, experts.down_proj)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = experts(x, routing).float()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        # the host loop: force it by running the same weights as float32 on the device
        want = experts.float()(x.float(), type(routing)(routing.weights.float(), routing.experts))
    assert ((got - want).norm() / want.norm()) < 2e-2


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen2_moe"])
def test_moe_decode_graphs_in_bf16(name: str, tmp_path: Path) -> None:
    """A Qwen MoE model in bf16 captures its decode graphs (its experts run grouped) and replays
    them. (gpt-oss stays eager: runtime/models/gpt_oss.py says why.)"""
    folder = save_tiny_model(name, tmp_path)
    prompts = shared_prefix_prompts()[:5]
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with Engine(model=str(folder), dtype="bfloat16", device="cuda", kv_cache_tokens=1024,
                max_running_requests=16, cuda_graph_max_bs=16) as engine:
        graphs = engine.runner.graphs
        assert graphs is not None and all(graphs.steps[s].graph is not None for s in graphs.sizes)
        sizes = record_replays(graphs)
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert_slots_balanced(engine)
    assert all(len(o.token_ids) == 6 for o in outs) and 5 in sizes
