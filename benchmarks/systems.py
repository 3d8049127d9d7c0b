"""The systems a benchmark compares, behind one interface: run a phase of requests, report timings.

- `radixserve` (and its `-nocache` / `-fcfs` variants): our Engine, requests submitted together.
- `transformers-batched`: `generate` on padded batches; `transformers-naive`: one request at a time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from benchmarks.workloads import Request


@dataclass
class Result:
    text: str
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    latency_s: float


class System:
    name: str

    def run_phase(self, requests: list[Request]) -> list[Result]:
        raise NotImplementedError

    def cache_hit_rate(self) -> float | None:
        return None

    def close(self) -> None:
        pass


class RadixSystem(System):
    def __init__(self, name: str, model: str, dtype: str = "auto", kv_cache_tokens: int = 65536, **engine_args: object) -> None:
        from runtime import Engine

        self.name = name
        self.engine = Engine(model=model, dtype=dtype, kv_cache_tokens=kv_cache_tokens, **engine_args)
        self._start = self.engine.stats()

    def run_phase(self, requests: list[Request]) -> list[Result]:
        results: list[Result | None] = [None] * len(requests)
        done = threading.Event()
        remaining = [0]
        lock = threading.Lock()
        selects = [i for i, r in enumerate(requests) if r.choices]
        gens = [i for i, r in enumerate(requests) if not r.choices]
        remaining[0] = len(gens)
        start = time.perf_counter()
        first: dict[int, float] = {}

        def sink_for(i: int, prompt_len: int):  # noqa: ANN202
            def sink(out) -> None:  # noqa: ANN001
                now = time.perf_counter()
                if out.token_ids and i not in first:
                    first[i] = now
                if out.finished:
                    results[i] = Result(out.text, prompt_len, out.completion_tokens, first.get(i, now) - start, now - start)
                    with lock:
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            done.set()
            return sink

        for i in gens:
            ids = self.engine.encode(requests[i].prompt)
            self.engine.submit(ids, {"max_new_tokens": requests[i].max_new_tokens, "temperature": 0,
                                     "ignore_eos": True}, sink_for(i, len(ids)), stream=True)
        if selects:
            self._selects(requests, selects, results, start)
        if gens:
            done.wait()
        return results  # type: ignore[return-value]

    def _selects(self, requests: list[Request], idx: list[int], results: list, start: float) -> None:
        batch, params, owners = [], [], []
        for i in idx:
            base = self.engine.encode(requests[i].prompt)
            for choice in requests[i].choices or []:
                ids = self.engine.encode(requests[i].prompt + choice)
                k = 0
                while k < min(len(base), len(ids)) and base[k] == ids[k]:
                    k += 1
                batch.append(ids)
                params.append({"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": min(k, len(ids) - 1)})
                owners.append(i)
        outs = self.engine.generate(input_ids=batch, sampling_params=params)
        end = time.perf_counter()
        scores: dict[int, list[float]] = {}
        for i, out in zip(owners, outs):
            values = [v for v, _ in out.logprobs.input_token_logprobs if v is not None]
            scores.setdefault(i, []).append(sum(values) / max(len(values), 1))
        for i in idx:
            best = max(range(len(scores[i])), key=scores[i].__getitem__)
            results[i] = Result(requests[i].choices[best], len(self.engine.encode(requests[i].prompt)), 0,
                                end - start, end - start)

    def cache_hit_rate(self) -> float:
        now = self.engine.stats()
        prompt = now["prompt_tokens_total"] - self._start["prompt_tokens_total"]
        cached = now["cached_tokens_total"] - self._start["cached_tokens_total"]
        return cached / prompt if prompt else 0.0

    def close(self) -> None:
        self.engine.shutdown()


class TransformersSystem(System):
    def __init__(self, name: str, model_path: str, batched: bool, dtype: torch.dtype = torch.float32,
                 max_batch: int = 16) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name = name
        self.batched = batched
        self.max_batch = max_batch if batched else 1
        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()
        # Every system generates exactly max_new_tokens: no stop strings from the checkpoint's config.
        self.model.generation_config.stop_strings = None

    def _encode(self, text: str) -> list[int]:
        ids = self.tok(text).input_ids
        bos = self.tok.bos_token_id
        return ids if bos is None or (ids and ids[0] == bos) else [bos, *ids]

    @torch.inference_mode()
    def run_phase(self, requests: list[Request]) -> list[Result]:
        start = time.perf_counter()
        results: list[Result | None] = [None] * len(requests)
        gens = [i for i, r in enumerate(requests) if not r.choices]
        for chunk_start in range(0, len(gens), self.max_batch):
            chunk = gens[chunk_start : chunk_start + self.max_batch]
            self._generate(requests, chunk, results, start)
        for i, req in enumerate(requests):
            if req.choices:
                results[i] = self._select(req, start)
        return results  # type: ignore[return-value]

    def _generate(self, requests: list[Request], chunk: list[int], results: list, start: float) -> None:
        from transformers import LogitsProcessor, LogitsProcessorList

        encoded = [self._encode(requests[i].prompt) for i in chunk]
        width = max(len(e) for e in encoded)
        pad = self.tok.pad_token_id or 0
        input_ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
        stamps: list[float] = []

        class Stamp(LogitsProcessor):
            def __call__(self, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                stamps.append(time.perf_counter())
                return scores

        max_new = max(requests[i].max_new_tokens for i in chunk)
        out = self.model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                  min_new_tokens=max_new, logits_processor=LogitsProcessorList([Stamp()]),
                                  pad_token_id=pad)
        end = time.perf_counter()
        for row, i in enumerate(chunk):
            new = out[row, width : width + requests[i].max_new_tokens].tolist()
            results[i] = Result(self.tok.decode(new, skip_special_tokens=True), len(encoded[row]), len(new),
                                stamps[0] - start if stamps else end - start, end - start)

    def _select(self, req: Request, start: float) -> Result:
        base = self._encode(req.prompt)
        scores = []
        for choice in req.choices or []:
            ids = self._encode(req.prompt + choice)
            k = 0
            while k < min(len(base), len(ids)) and base[k] == ids[k]:
                k += 1
            k = min(k, len(ids) - 1)
            logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)
            values = [float(logp[p - 1, ids[p]]) for p in range(max(k, 1), len(ids))]
            scores.append(sum(values) / max(len(values), 1))
        best = max(range(len(scores)), key=scores.__getitem__)
        end = time.perf_counter()
        return Result((req.choices or [])[best], len(base), 0, end - start, end - start)
