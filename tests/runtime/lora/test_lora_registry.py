"""Loading and unloading adapters: bad adapters refused by name, least-recently-used room over
--max-loaded-loras (read back on demand, only with the same digest), never unloaded under a running
request, and load/unload under load with nothing lost and every KV slot back. Plus LoRA over a
quantized base: the delta is added around whatever module the base is."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from runtime import Engine
from runtime.lora.adapter import Target, read_adapter
from runtime.lora.apply import LoraBatch, LoraLinear
from runtime.exec.context import ForwardContext, forward_context
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.runtime.lora.conftest import GREEDY, LoraSetup, lora_paths, run_mixed


def _engine(s: LoraSetup, **kwargs: object) -> Engine:
    return Engine(model=str(s.base), dtype="float32", kv_cache_tokens=1024, **kwargs)


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_bad_adapters_are_refused_by_name(llama_lora: LoraSetup, tmp_path: Path) -> None:
    s = llama_lora
    with _engine(s, enable_lora=True) as engine:
        with pytest.raises(ValueError, match="not a folder"):
            engine.load_lora_adapter("x", str(tmp_path / "missing"))
        dora = _copy(s.adapters["a"], tmp_path / "dora")
        config = json.loads((dora / "adapter_config.json").read_text())
        (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
        with pytest.raises(ValueError, match="use_dora"):
            engine.load_lora_adapter("x", str(dora))
        with pytest.raises(ValueError, match="valid adapter name"):
            engine.load_lora_adapter("bad name/..", str(s.adapters["a"]))
        engine.load_lora_adapter("a", str(s.adapters["a"]))
        with pytest.raises(ValueError, match="already loaded"):
            engine.load_lora_adapter("a", str(s.adapters["b"]))
        with pytest.raises(LookupError):
            engine.generate(input_ids=s.prompts[0], sampling_params=GREEDY, lora="nope")
        assert engine.stats()["num_waiting"] == 0 and engine.queued == 0
    # an adapter for another model's shapes
    targets = {"model.layers.0.self_attn.qkv_proj": Target(32, (32, 16, 16))}
    with pytest.raises(ValueError, match="another base model|no matching layer"):
        read_adapter("a", s.adapters["a"], targets, torch.float32, torch.device("cpu"))
    with _engine(s) as engine, pytest.raises(ValueError, match="enable-lora"):
        engine.generate(input_ids=s.prompts[0], sampling_params=GREEDY, lora="a")


def test_least_recently_used_idle_adapter_makes_room(llama_lora: LoraSetup, tmp_path: Path) -> None:
    s = llama_lora
    a = _copy(s.adapters["a"], tmp_path / "a")
    with _engine(s, lora_paths=[f"a={a}"], max_loaded_loras=1) as engine:
        engine.load_lora_adapter("b", str(s.adapters["b"]))  # a is idle: dropped from memory, still known
        assert engine.lora.held_count() == 1 and set(engine.lora.names()) == {"a", "b"}
        outs = engine.generate(input_ids=s.prompts, sampling_params=GREEDY, lora="a")  # read back
        assert [o.token_ids for o in outs] == s.want["a"] and engine.lora.loads == 3
        stats = engine.stats()
        assert (stats["lora_adapters"], stats["lora_adapters_held"], stats["lora_reads_total"],
                stats["lora_dropped_total"]) == (2, 1, 3, 2)
        # b was dropped for a; a's files change on disk: asking for b is fine, a is refused, not served stale
        (a / "adapter_model.safetensors").write_bytes((s.adapters["c"] / "adapter_model.safetensors").read_bytes())
        assert engine.generate(input_ids=s.prompts[0], sampling_params=GREEDY, lora="b")[0].token_ids == s.want["b"][0]
        with pytest.raises(ValueError, match="changed since it was loaded"):
            engine.generate(input_ids=s.prompts[0], sampling_params=GREEDY, lora="a")
        # while b runs, nothing can make room: loading another is refused clearly
        gate = threading.Event()
        long = {**GREEDY, "max_new_tokens": 200}
        rids = engine.submit(s.prompts[0], long, lambda out: gate.set() if out.finished else None, lora="b")
        with pytest.raises(RuntimeError, match="in use"):
            engine.load_lora_adapter("c", str(s.adapters["c"]))
        engine.abort(rids[0])
        assert gate.wait(60)
        engine.load_lora_adapter("c", str(s.adapters["c"]))
        assert_slots_balanced(engine)


def test_unload_never_under_a_running_request(llama_lora: LoraSetup) -> None:
    s = llama_lora
    with _engine(s, lora_paths=lora_paths(s, ("a",))) as engine:
        steps = 40
        started, done = threading.Event(), []
        params = {**GREEDY, "max_new_tokens": steps}

        def sink(out: object) -> None:
            started.set()
            if out.finished:
                done.append(out)

        engine.submit(s.prompts[0], params, sink, lora="a", stream=True)
        assert started.wait(60)
        engine.unload_lora_adapter("a")  # at once for new requests; the running one keeps its adapter
        with pytest.raises(LookupError):
            engine.submit(s.prompts[1], params, lambda out: None, lora="a")
        want = engine.generate(input_ids=s.prompts[2], sampling_params=GREEDY)[0]  # the base still serves
        assert want.token_ids == s.want[None][2]
        for _ in range(600):
            if done:
                break
            threading.Event().wait(0.1)
        assert done and done[0].finish_reason == "length" and len(done[0].token_ids) == steps
        assert done[0].token_ids[:GREEDY["max_new_tokens"]] == s.want["a"][0]
        assert_slots_balanced(engine)


def test_load_and_unload_under_load(llama_lora: LoraSetup) -> None:
    """Requests for three adapters and the base run while another thread loads and unloads a fourth
    name again and again: every request finishes with its own adapter's output, every slot comes back."""
    s = llama_lora
    with _engine(s, lora_paths=lora_paths(s), max_running_requests=8) as engine:
        stop = threading.Event()
        churn = {"loads": 0}

        def load_unload() -> None:
            while not stop.is_set():
                engine.load_lora_adapter("d", str(s.adapters["c"]))
                engine.unload_lora_adapter("d")
                churn["loads"] += 1

        worker = threading.Thread(target=load_unload)
        worker.start()
        try:
            jobs = [(p, n) for _ in range(2) for n in (None, "a", "b", "c") for p in s.prompts]
            outs = run_mixed(engine, jobs)
        finally:
            stop.set()
            worker.join()
        assert churn["loads"] > 0
        assert [o.token_ids for o in outs] == [s.want[n][s.prompts.index(p)] for p, n in jobs]
        assert all(o.finish_reason == "length" for o in outs)
        assert all(a.users == 0 for a in engine.lora._held.values())
        assert_slots_balanced(engine)


class _Doubling(torch.nn.Module):
    """A base module of no known kind (as a quantized layer may be), with no weight for LoRA to read:
    64 inputs to gate_up_proj's 192 outputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(1, 3) * 2


def test_lora_linear_wraps_any_base(llama_lora: LoraSetup) -> None:
    from runtime.lora.registry import LoadedAdapter

    torch.manual_seed(0)
    a = read_adapter("a", llama_lora.adapters["a"], _llama_targets(), torch.float32, torch.device("cpu"))
    layer = LoraLinear("model.layers.0.mlp.gate_up_proj", _Doubling())
    x = torch.randn(5, 64)
    pair = a.layers["model.layers.0.mlp.gate_up_proj"]
    want = _Doubling()(x)
    want[1:4] += (x[1:4] @ pair.a.T @ pair.b.T) * pair.scale  # the adapter entry's three token rows
    batch = LoraBatch.of([None, LoadedAdapter(a), None], [1, 3, 1], torch.device("cpu"))
    with forward_context(ForwardContext(None, [], [], None, batch)):
        got = layer(x)
    torch.testing.assert_close(got, want)
    assert torch.equal(layer(x), _Doubling()(x))  # outside a step: the base alone


def _llama_targets() -> dict[str, Target]:
    """The tiny llama's targets (read_adapter wants every module the adapter names to exist)."""
    t = {}
    for i in range(3):
        p = f"model.layers.{i}"
        t[f"{p}.self_attn.qkv_proj"] = Target(64, (64, 32, 32))
        t[f"{p}.self_attn.o_proj"] = Target(64, (64,))
        t[f"{p}.mlp.gate_up_proj"] = Target(64, (96, 96))
        t[f"{p}.mlp.down_proj"] = Target(96, (64,))
    return t


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_adapters_over_a_quantized_base(llama_lora: LoraSetup, quantization: str) -> None:
    """bf16 with int8 / int4 weights: each adapter changes the output, and mixed batches serve them."""
    s = llama_lora
    with Engine(model=str(s.base), dtype="bfloat16", quantization=quantization, kv_cache_tokens=1024,
                lora_paths=lora_paths(s)) as engine:
        alone = {n: [o.token_ids for o in engine.generate(input_ids=s.prompts, sampling_params=GREEDY, lora=n)]
                 for n in (None, "a", "b", "c")}
        assert all(alone[n] != alone[None] for n in ("a", "b", "c"))
        outs = run_mixed(engine, [(p, n) for n in (None, "a", "b", "c") for p in s.prompts])
        assert len(outs) == 16 and all(o.finish_reason == "length" for o in outs)
        assert_slots_balanced(engine)
