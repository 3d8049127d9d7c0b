"""GPU engine benchmark: decode and prefill throughput of dummy-weight real configs, beside transformers.

For each model config (benchmarks/configs/, random weights via `--load-format dummy`, bf16), in
one process and one run:
- decode: B prompts of `--prompt-len` random tokens, `--new-tokens` each, ignore_eos, for each
  B in `--batches`: output tokens/s over the whole run (prefill included, as SGLang's offline
  throughput counts it), and where the loop's time went per step (host scheduling, host launch,
  host processing, device busy, device idle share), from runtime/step/timing.py;
- prefill: `--prefill-batch` x `--prefill-len` tokens with one new token each, tokens/s;
- shared prefix: `--prefill-batch` requests sharing a `--prefill-len` prefix plus 32 tokens of
  their own, 32 new tokens each, with the prefix cache on and then off (a second engine);
- transformers: `generate` (greedy, exactly `--new-tokens` tokens) at `--hf-batches` on the same
  shapes, and one forward over the prefill shape, on the same weights' shapes and dtype.
Variants: `--eager` adds a decode run at the largest batch with CUDA graphs and overlap off.

    python -m benchmarks.gpu_engine --json benchmarks/results/gpu_engine.json
    python -m benchmarks.gpu_engine --models gemma3-270m --batches 1 64 --hf-batches 1 64

Runs anywhere: `--device cpu` with a tiny config and small shapes is how CI checks the script.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

CONFIGS = Path(__file__).resolve().parent / "configs"
# The issue's targets (H100, bf16): model -> figure -> minimum.
TARGETS = {
    "gemma3-270m": {"decode_tok_s@1": 700, "decode_tok_s@64": 30_000, "decode_tok_s@256": 80_000,
                    "prefill_tok_s": 400_000, "speedup_vs_transformers@64": 10},
    "llama-3.2-1b": {"decode_tok_s@64": 20_000},
}


def _config_folder(name: str) -> Path:
    folder = CONFIGS / name
    return folder if folder.is_dir() else Path(name)


def _random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    # Away from the special ids at the start of most vocabularies.
    return torch.randint(10, vocab, (count, length), generator=gen).tolist()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


class EngineBench:
    def __init__(self, folder: Path, args: argparse.Namespace, **engine_args: object) -> None:
        from runtime import Engine

        max_bs = max(args.batches + [args.prefill_batch])
        self.device = args.device
        self.engine = Engine(model=str(folder), load_format="dummy", device=args.device, dtype=args.dtype,
                             max_running_requests=max_bs, cuda_graph_max_bs=max_bs,
                             chunked_prefill_size=args.chunked_prefill_size, max_prefill_tokens=args.max_prefill_tokens,
                             context_length=args.prompt_len + args.new_tokens + args.prefill_len + 64,
                             **engine_args)
        self.vocab = self.engine.info.vocab_size
        self._run([[11, 12, 13]], 4)  # warm-up: first launches, allocator growth

    def _run(self, prompts: list[list[int]], new_tokens: int) -> float:
        self.engine.flush_cache()
        _sync(self.device)
        start = time.perf_counter()
        outs = self.engine.generate(input_ids=prompts, sampling_params={
            "max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True})
        _sync(self.device)
        assert all(len(o.token_ids) == new_tokens for o in outs), "a request stopped early"
        return time.perf_counter() - start

    def decode(self, batch: int, prompt_len: int, new_tokens: int) -> dict:
        prompts = _random_prompts(batch, prompt_len, self.vocab, seed=batch)
        # A short untimed run at this batch first: a graph's or a kernel's first use at a new
        # shape (Triton's specialisations, the allocator's growth) stays out of the timed steps.
        self._run(prompts, 4)
        with self.engine.time_steps() as timings:
            seconds = self._run(prompts, new_tokens)
        return {"batch": batch, "seconds": seconds, "tok_s": batch * new_tokens / seconds,
                **timings.summary(seconds)}

    def prefill(self, batch: int, length: int) -> dict:
        prompts = _random_prompts(batch, length, self.vocab, seed=7)
        self._run(prompts[:2], 1)  # warm the prefill shapes
        seconds = self._run(prompts, 1)
        return {"batch": batch, "length": length, "seconds": seconds, "tok_s": batch * length / seconds}

    def shared_prefix(self, batch: int, prefix_len: int) -> dict:
        # An untimed round over another prefix first: the extend-over-a-cached-prefix kernels compile
        # there, not in the timed region (on 2026-11-28 the first round of each engine was timed,
        # and Gemma's cache-on figure came out below cache-off).
        def prompts_over(prefix_seed: int) -> list[list[int]]:
            prefix = _random_prompts(1, prefix_len, self.vocab, seed=prefix_seed)[0]
            return [prefix + own for own in _random_prompts(batch, 32, self.vocab, seed=prefix_seed + 1)]

        self._run(prompts_over(5), 32)
        prompts = prompts_over(3)
        before = self.engine.stats()
        seconds = self._run(prompts, 32)
        after = self.engine.stats()
        prompt_tokens = after["prompt_tokens_total"] - before["prompt_tokens_total"]
        cached = after["cached_tokens_total"] - before["cached_tokens_total"]
        return {"requests": batch, "seconds": seconds, "req_s": batch / seconds,
                "hit_rate": cached / prompt_tokens if prompt_tokens else 0.0}

    def close(self) -> None:
        self.engine.shutdown()
        del self.engine
        _free(self.device)


def transformers_figures(folder: Path, args: argparse.Namespace) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    dtype = torch.bfloat16 if args.dtype in ("auto", "bfloat16") else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(args.device).eval()
    out: dict = {"decode": {}}
    with torch.inference_mode():
        for batch in args.hf_batches:
            ids = torch.tensor(_random_prompts(batch, args.prompt_len, config.vocab_size, seed=batch),
                               device=args.device)
            model.generate(ids[:, :8], max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
            _sync(args.device)
            start = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                           min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
            _sync(args.device)
            seconds = time.perf_counter() - start
            out["decode"][str(batch)] = {"batch": batch, "seconds": seconds,
                                         "tok_s": batch * args.new_tokens / seconds}
        ids = torch.tensor(_random_prompts(args.prefill_batch, args.prefill_len, config.vocab_size, seed=7),
                           device=args.device)
        model(ids[:2])
        _sync(args.device)
        start = time.perf_counter()
        model(ids)
        _sync(args.device)
        out["prefill_tok_s"] = ids.numel() / (time.perf_counter() - start)
    del model
    _free(args.device)
    return out


def bench_model(name: str, args: argparse.Namespace) -> dict:
    folder = _config_folder(name)
    result: dict = {"decode": {}}
    bench = EngineBench(folder, args)
    for batch in args.batches:
        result["decode"][str(batch)] = bench.decode(batch, args.prompt_len, args.new_tokens)
        print(f"{name} decode batch {batch}: {result['decode'][str(batch)]['tok_s']:,.0f} tok/s", flush=True)
    result["prefill"] = bench.prefill(args.prefill_batch, args.prefill_len)
    print(f"{name} prefill: {result['prefill']['tok_s']:,.0f} tok/s", flush=True)
    result["shared_prefix_cache_on"] = bench.shared_prefix(args.prefill_batch, args.prefill_len)
    bench.close()
    bench = EngineBench(folder, args, enable_prefix_cache=False)
    result["shared_prefix_cache_off"] = bench.shared_prefix(args.prefill_batch, args.prefill_len)
    bench.close()
    if args.eager:
        bench = EngineBench(folder, args, disable_cuda_graph=True, overlap_schedule="off")
        batch = max(args.batches)
        result["decode_eager"] = bench.decode(batch, args.prompt_len, args.new_tokens)
        bench.close()
    if args.hf_batches:
        result["transformers"] = transformers_figures(folder, args)
        for batch, hf in result["transformers"]["decode"].items():
            ours = result["decode"].get(batch)
            if ours:
                result[f"speedup_vs_transformers@{batch}"] = ours["tok_s"] / hf["tok_s"]
    result["targets"] = _check_targets(name, result)
    return result


def _check_targets(name: str, result: dict) -> dict:
    figures = {f"decode_tok_s@{b}": r["tok_s"] for b, r in result["decode"].items()}
    figures["prefill_tok_s"] = result["prefill"]["tok_s"]
    figures.update({k: v for k, v in result.items() if k.startswith("speedup_vs_transformers@")})
    return {key: {"target": want, "measured": figures.get(key), "met": figures.get(key, 0) >= want}
            for key, want in TARGETS.get(Path(name).name, {}).items()}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(report: dict) -> str:
    lines = ["| model | batch | radixserve tok/s | transformers tok/s | ratio | host sched / launch / process ms | "
             "device busy ms | device idle |", "|---|---:|---:|---:|---:|---|---:|---:|"]
    for name, r in report["models"].items():
        hf = r.get("transformers", {}).get("decode", {})
        for batch, d in r["decode"].items():
            theirs = hf.get(batch, {}).get("tok_s")
            ratio = None if theirs is None else d["tok_s"] / theirs
            idle = d.get("device_idle_share")
            host = " / ".join(f"{d[f'host_{phase}_ms_per_step']:.2f}" for phase in ("schedule", "launch", "process"))
            lines.append(f"| {name} | {batch} | {d['tok_s']:,.0f} | {_fmt(theirs, ',.0f')} | {_fmt(ratio, '.1f', 'x')} | "
                         f"{host} | {_fmt(d.get('device_busy_ms_per_step'), '.2f')} | "
                         f"{_fmt(None if idle is None else 100 * idle, '.0f', '%')} |")
    lines += ["", "| model | prefill tok/s | transformers prefill tok/s | shared prefix req/s, cache on / off |",
              "|---|---:|---:|---|"]
    for name, r in report["models"].items():
        on, off = r["shared_prefix_cache_on"], r["shared_prefix_cache_off"]
        lines.append(f"| {name} | {r['prefill']['tok_s']:,.0f} | "
                     f"{_fmt(r.get('transformers', {}).get('prefill_tok_s'), ',.0f')} | "
                     f"{on['req_s']:.1f} ({100 * on['hit_rate']:.0f}% hit) / {off['req_s']:.1f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "llama-3.2-1b"],
                   help="names under benchmarks/configs/, or config folders")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 256])
    p.add_argument("--hf-batches", nargs="*", type=int, default=[1, 64], help="transformers generate batch sizes")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prefill-batch", type=int, default=64)
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--max-prefill-tokens", type=int, default=32768)
    p.add_argument("--eager", action="store_true", help="also decode at the largest batch without graphs or overlap")
    p.add_argument("--json", default=None, help="write the report here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_engine: no CUDA device here (use --device cpu for a smoke run)")
        return {}
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    report: dict = {"device": device_name, "torch": torch.__version__, "args": vars(args), "models": {}}
    for name in args.models:
        report["models"][name] = bench_model(name, args)
        # The table and the report after every model: a GPU lease can end mid-run, and what ran is kept.
        report["markdown"] = markdown(report)
        print(report["markdown"], flush=True)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
