"""Multi-LoRA serving against merged models, and what an adapter costs (docs/lora.md).

    python -m benchmarks.lora [--model default] [--adapters 8] [--requests 8] [--tokens 32] [--json out.json]

The workload: `adapters` random PEFT adapters (rank 16 on q/k/v/o/gate/up/down) for the base model,
each with a system prompt of its own (~200 tokens, shared by that adapter's requests) and
`requests` short questions per adapter, interleaved (adapter 0, 1, ..., 7, 0, 1, ...) and submitted
at once: mixed traffic. Each request generates `tokens` tokens (greedy, ignore_eos). Rows:

- base: the same requests on the base model, an engine without LoRA (the reference cost);
- base, LoRA on: the base model's requests through an engine with the adapters loaded (what the
  wrappers cost a request that uses none);
- multi-LoRA: the mixed requests through one engine with every adapter loaded (mixed batches);
- merged, one after another: each adapter merged into the base weights (PEFT's merge_and_unload),
  served by an engine of its own over the merged checkpoint, its requests at once; the engines run
  one after another (this 2-core machine would only share its cores among eight processes), and
  requests/s counts the serving time only; the load time of the eight engines is printed beside.

The multi-LoRA and merged rows serve the same dense bf16 weights (`--quantization none`): a merged
checkpoint is dense, so the base is too, for a like-for-like product. The base and multi-LoRA rows
over the GGUF's own quantized blocks (the default model's default) follow, and one stream's
tokens/s through the base model and through an adapter (dense base; best of 3). Everything runs in
this process, one engine at a time, with the prefix cache on. The adapters and merged checkpoints
are written once under ~/.cache/radixserve/bench-lora/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from benchmarks.speculative import document

CACHE = Path.home() / ".cache" / "radixserve" / "bench-lora"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                   "special_tokens_map.json", "tokenizer.model")


def build(base: Path, count: int, rank: int = 16) -> tuple[list[Path], list[Path]]:
    """`count` adapters for `base` and their merged checkpoints (written once, then reused)."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    root = CACHE / base.name
    adapters = [root / f"adapter-{i}" for i in range(count)]
    merged = [root / f"merged-{i}" for i in range(count)]
    for i, (adapter, whole) in enumerate(zip(adapters, merged)):
        if (whole / "model.safetensors").is_file() and (adapter / "adapter_model.safetensors").is_file():
            continue
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
        gen = torch.Generator().manual_seed(1000 + i)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:  # PEFT starts B at zero (no effect): a trained adapter's size of delta
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
        peft_model.save_pretrained(str(adapter))
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        merged_model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        merged_model.to(torch.bfloat16).save_pretrained(str(whole))
        for name in TOKENIZER_FILES:
            if (base / name).is_file():
                shutil.copy(base / name, whole / name)
    return adapters, merged


def workload(count: int, per_adapter: int) -> list[tuple[int, str]]:
    """(adapter index, prompt), interleaved across adapters; each adapter's prompts share its system prompt."""
    systems = [f"You are assistant number {i} of the river village archive. " + document(150, seed=100 + i)
               for i in range(count)]
    questions = [f"\n\nQuestion {q}: what did the council decide about the bridge in year {1200 + 7 * q}?\nAnswer:"
                 for q in range(per_adapter)]
    return [(i, systems[i] + questions[q]) for q in range(per_adapter) for i in range(count)]


def serve(engine: object, jobs: list[tuple[str | None, list[int]]], tokens: int) -> dict[str, object]:
    """Submit every (adapter, prompt ids) at once; seconds until all finished, the tokens generated
    and each job's output ids (in job order)."""
    import threading

    done, finished = threading.Event(), []
    lock = threading.Lock()
    params = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}

    def sink(out: object) -> None:
        if out.finished:
            with lock:
                finished.append(out)
                if len(finished) == len(jobs):
                    done.set()

    start = time.perf_counter()
    rids = [engine.submit(ids, params, sink, lora=name)[0] for name, ids in jobs]
    done.wait()
    seconds = time.perf_counter() - start
    assert all(o.error is None for o in finished), [o.error for o in finished if o.error]
    return {"seconds": seconds, "requests_per_s": len(jobs) / seconds,
            "tokens_per_s": sum(o.completion_tokens for o in finished) / seconds,
            "cached_share": sum(o.cached_tokens for o in finished) / sum(o.prompt_tokens for o in finished),
            "outputs": [next(o.token_ids for o in finished if o.rid == rid) for rid in rids]}


def one_stream(engine: object, ids: list[int], name: str | None, tokens: int, rounds: int = 3) -> float:
    """Tokens/s of one request alone (best of `rounds`; the prompt cached after the first)."""
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": tokens, "temperature": 0,
                                                              "ignore_eos": True}, lora=name)[0]
        best = max(best, out.completion_tokens / (time.perf_counter() - start))
    return best


def warm(engine: object, ids: list[int], name: str | None = None) -> None:
    engine.generate(input_ids=ids[:16], sampling_params={"max_new_tokens": 2}, lora=name)
    engine.flush_cache()


def run(model: str, count: int, per_adapter: int, tokens: int) -> dict[str, object]:
    from runtime import Engine
    from runtime.loading.sources import resolve_model_path

    base = resolve_model_path(model)
    adapters, merged = build(base, count)
    paths = [f"lora{i}={p}" for i, p in enumerate(adapters)]
    results: dict[str, object] = {"model": model, "adapters": count, "requests": count * per_adapter,
                                  "tokens": tokens}
    common = dict(model=model, max_running_requests=64)
    with Engine(**common, quantization="none") as engine:
        encoded = [(i, engine.encode(p)) for i, p in workload(count, per_adapter)]
        warm(engine, encoded[0][1])
        results["base"] = serve(engine, [(None, ids) for _, ids in encoded], tokens)
    with Engine(**common, quantization="none", lora_paths=paths) as engine:
        warm(engine, encoded[0][1], "lora0")
        results["base_lora_on"] = serve(engine, [(None, ids) for _, ids in encoded], tokens)
        engine.flush_cache()
        results["multi_lora"] = serve(engine, [(f"lora{i}", ids) for i, ids in encoded], tokens)
        # one stream, the base model's and an adapter's request in turn (the adapter's per-token cost)
        results["one_stream_base"] = one_stream(engine, encoded[0][1], None, 64)
        results["one_stream_adapter"] = one_stream(engine, encoded[0][1], "lora0", 64)
    with Engine(**common) as engine:  # the GGUF's own blocks, as the default model serves, without LoRA
        results["shipped_quantization"] = engine.info.quantization
        warm(engine, encoded[0][1])
        results["base_shipped"] = serve(engine, [(None, ids) for _, ids in encoded], tokens)
    with Engine(**common, lora_paths=paths) as engine:  # and with the adapters
        warm(engine, encoded[0][1], "lora0")
        results["multi_lora_shipped"] = serve(engine, [(f"lora{i}", ids) for i, ids in encoded], tokens)
    serving, loading, finished = 0.0, 0.0, 0
    same = 0  # requests whose merged output is the multi-LoRA (dense) output, token for token
    dense = results["multi_lora"]["outputs"]  # type: ignore[index]
    for i, folder in enumerate(merged):
        start = time.perf_counter()
        with Engine(model=str(folder), max_running_requests=64, quantization="none") as engine:
            loading += time.perf_counter() - start
            mine = [(None, ids) for j, ids in encoded if j == i]
            warm(engine, mine[0][1])
            part = serve(engine, mine, tokens)
            same += sum(out == dense[k] for out, k in zip(part["outputs"], [k for k, (j, _) in enumerate(encoded) if j == i]))
            serving += part["seconds"]
            finished += len(mine)
    results["merged_sequential"] = {"seconds": serving, "requests_per_s": finished / serving,
                                    "tokens_per_s": finished * tokens / serving, "load_seconds": loading,
                                    "same_as_multi_lora": same}
    for row in results.values():
        if isinstance(row, dict):
            row.pop("outputs", None)
    return results


def report(r: dict[str, object]) -> str:
    shipped = r["shipped_quantization"]
    rows = [("base model, no LoRA", r["base"]), ("base model's requests, LoRA on", r["base_lora_on"]),
            (f"{r['adapters']} adapters mixed, one engine", r["multi_lora"]),
            (f"{r['adapters']} merged models, one after another", r["merged_sequential"]),
            (f"base model, no LoRA ({shipped} base)", r["base_shipped"]),
            (f"{r['adapters']} adapters mixed, one engine ({shipped} base)", r["multi_lora_shipped"])]
    lines = ["| serving | requests/s | tokens/s | seconds |", "|---|---:|---:|---:|"]
    for label, row in rows:
        lines.append(f"| {label} | {row['requests_per_s']:.2f} | {row['tokens_per_s']:.1f} | {row['seconds']:.2f} |")
    lines.append(f"\none stream, 64 tokens (dense bf16 base): base model {r['one_stream_base']:.1f} tok/s, "
                 f"through an adapter {r['one_stream_adapter']:.1f} tok/s")
    merged = r["merged_sequential"]
    lines.append(f"\nmerged engines' load time, all {r['adapters']}: {merged['load_seconds']:.1f} s (not in their "
                 f"requests/s); merged output identical to the multi-LoRA output (bf16) for "
                 f"{merged['same_as_multi_lora']} of {r['requests']} requests")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--requests", type=int, default=8, help="requests per adapter")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = run(args.model, args.adapters, args.requests, args.tokens)
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
