"""One HTTP client for the paper workloads, with each peer's own route for what the OpenAI API leaves open.

Generation is /v1/completions for every peer (the same text, greedy, a fixed token count). Two
things differ by peer, each through that peer's fastest route that gives the correct answer:

- select (a choice among continuations, scored by the mean logprob of the choice's tokens, as
  SGLang's `select` does):
  - radixserve: one-token choices as one `/generate` of one token with a +100 `logit_bias` on the
    choices' tokens (one request and one logits row, as the peers' routes); longer choices with the
    prompt and each choice as token ids and `logprob_start_len` at the choice, all choices in one
    batch request (the prompt is computed once and cached);
  - vLLM: one-token choices as one generation of one token restricted to the choices'
    tokens (`allowed_token_ids`; greedy, so the answer is the choice of highest logprob);
    longer choices as one request per choice with `prompt_logprobs` (which vLLM serves without
    reading its prefix cache: `SamplingParams.skip_reading_prefix_cache`);
  - llama.cpp (llama-cpp-python): one-token choices as one token with a +100 `logit_bias` on the
    choices' tokens; longer choices as one request per choice with `echo` and `logprobs` (its
    server keeps every position's logits by default, `logits_all`).
- JSON against a schema: `response_format` json_schema (radixserve, vLLM); llama.cpp takes a
  GBNF `grammar`, made from the schema by llama-cpp-python's own converter (in its venv).

Token ids come from the default model's own tokenizer (every peer serves the same vocabulary).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.paper_workloads import PaperRequest

SELECT_ROUTES = {
    "radixserve": "one-token choices: /generate 1 token with logit_bias +100 on the choices' ids (one request, "
                  "prefix cached); longer: /generate prompt logprobs from the choice (one batch call, prefix cached)",
    "vllm": "one-token choices: 1 token with allowed_token_ids; longer: prompt_logprobs per choice (cache not read)",
    "llama.cpp": "one-token choices: 1 token with logit_bias +100; longer: echo+logprobs per choice (not run: see below)",
}


@dataclass
class CallResult:
    text: str
    latency_s: float
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # None where the peer does not report it
    completion_tokens: int = 0
    http_calls: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


def _common(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


class PaperClient:
    def __init__(self, base_url: str, kind: str, tokenizer: Any, grammar: str | None = None,
                 timeout: float = 900.0) -> None:
        self.kind = kind  # "radixserve", "vllm" or "llama.cpp"
        root = base_url.rstrip("/").removesuffix("/v1")
        self.http = httpx.AsyncClient(base_url=root, timeout=timeout)
        self.tok = tokenizer
        self.grammar = grammar  # llama.cpp's GBNF for the JSON workload's schema

    async def close(self) -> None:
        await self.http.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = await self.http.post(path, json=body)
        if response.status_code != 200:
            raise RuntimeError(f"{self.kind} {path}: HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    @staticmethod
    def _usage(out: dict[str, Any]) -> tuple[int, int | None, int]:
        usage = out.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return usage.get("prompt_tokens", 0), cached, usage.get("completion_tokens", 0)

    async def run(self, req: PaperRequest) -> CallResult:
        if req.choices:
            return await self.select(req)
        return await self.generate(req)

    async def generate(self, req: PaperRequest) -> CallResult:
        body: dict[str, Any] = {"model": "default", "prompt": req.prompt, "max_tokens": req.max_new_tokens,
                                "temperature": 0}
        if req.schema is None:  # the same work for every peer, whatever its rounding makes it write
            body.update(ignore_eos=True, min_tokens=req.max_new_tokens)
        elif self.kind == "llama.cpp":
            body["grammar"] = self.grammar
        else:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "record", "schema": req.schema, "strict": True}}
        start = time.perf_counter()
        out = await self._post("/v1/completions", body)
        prompt, cached, completion = self._usage(out)
        return CallResult(out["choices"][0]["text"], time.perf_counter() - start, prompt, cached, completion)

    async def select(self, req: PaperRequest) -> CallResult:
        choices = req.choices or []
        base = self.tok(req.prompt).input_ids
        full = [self.tok(req.prompt + c).input_ids for c in choices]
        starts = [min(_common(base, ids), len(ids) - 1) for ids in full]
        one_token = all(len(ids) - s == 1 for ids, s in zip(full, starts)) and len({ids[-1] for ids in full}) == len(full)
        start = time.perf_counter()
        # one request holds one prompt: every choice's token must follow the same prompt tokens
        if self.kind == "radixserve" and one_token and all(ids[:-1] == full[0][:-1] for ids in full):
            result = await self._select_native_one_token(full[0][:-1], [ids[-1] for ids in full])
        elif self.kind == "radixserve":
            result = await self._select_native(full, starts)
        elif one_token:
            result = await self._select_one_token(req.prompt, choices, [ids[-1] for ids in full])
        else:
            result = await self._select_prompt_logprobs(req.prompt, choices, full, starts)
        best, prompt, cached, calls = result
        return CallResult(choices[best], time.perf_counter() - start, prompt, cached, 0, calls,
                          {"one_token": one_token})

    async def _select_native(self, full: list[list[int]], starts: list[int]) -> tuple[int, int, int | None, int]:
        params = [{"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": s} for s in starts]
        outs = await self._post("/generate", {"input_ids": full, "sampling_params": params})
        outs = outs if isinstance(outs, list) else [outs]
        scores = []
        for out in outs:
            values = [v for v, *_ in out["meta_info"]["input_token_logprobs"] if v is not None]
            scores.append(sum(values) / max(len(values), 1))
        prompt = sum(o["meta_info"]["prompt_tokens"] for o in outs)
        cached = sum(o["meta_info"]["cached_tokens"] for o in outs)
        return max(range(len(scores)), key=scores.__getitem__), prompt, cached, 1

    async def _select_native_one_token(self, prompt_ids: list[int],
                                       token_ids: list[int]) -> tuple[int, int, int | None, int]:
        """The choice whose token is likeliest next: one token, greedy, the choices' ids lifted over
        every other (logit_bias, as llama.cpp's route): one request and one logits row, where
        prompt logprobs score each choice as a request of its own."""
        params = {"max_new_tokens": 1, "temperature": 0, "logit_bias": {str(t): 100.0 for t in token_ids}}
        out = await self._post("/generate", {"input_ids": prompt_ids, "sampling_params": params})
        picked = out["output_ids"][0]
        if picked not in token_ids:
            raise RuntimeError(f"radixserve: the restricted token {picked} is none of the choices' {token_ids}")
        meta = out["meta_info"]
        return token_ids.index(picked), meta["prompt_tokens"], meta["cached_tokens"], 1

    async def _select_one_token(self, prompt: str, choices: list[str],
                                token_ids: list[int]) -> tuple[int, int, int | None, int]:
        body: dict[str, Any] = {"model": "default", "prompt": prompt, "max_tokens": 1, "temperature": 0}
        if self.kind == "vllm":
            body["allowed_token_ids"] = token_ids
        else:
            body.update(logit_bias={str(t): 100.0 for t in token_ids}, logit_bias_type="input_ids")
        out = await self._post("/v1/completions", body)
        text = out["choices"][0]["text"]
        stripped = [c.strip() for c in choices]
        if text.strip() not in stripped:
            raise RuntimeError(f"{self.kind}: the restricted token {text!r} is none of the choices")
        best = stripped.index(text.strip())
        prompt_tokens, cached, _ = self._usage(out)
        return best, prompt_tokens, cached, 1

    async def _select_prompt_logprobs(self, prompt: str, choices: list[str], full: list[list[int]],
                                      starts: list[int]) -> tuple[int, int, int | None, int]:
        async def score(choice: str, ids: list[int], start: int) -> tuple[float, int, int | None]:
            n = len(ids) - start
            if self.kind == "vllm":
                out = await self._post("/v1/completions", {"model": "default", "prompt": ids, "max_tokens": 1,
                                                            "temperature": 0, "prompt_logprobs": 0})
                entries = out["choices"][0]["prompt_logprobs"][-n:]
                values = [entry[str(t)]["logprob"] for entry, t in zip(entries, ids[-n:])]
            else:
                out = await self._post("/v1/completions", {"model": "default", "prompt": prompt + choice,
                                                            "max_tokens": 1, "temperature": 0, "echo": True,
                                                            "logprobs": 1})
                count = out["usage"]["prompt_tokens"]
                values = out["choices"][0]["logprobs"]["token_logprobs"][count - n:count]
            prompt_tokens, cached, _ = self._usage(out)
            return sum(values) / n, prompt_tokens, cached

        scored = await asyncio.gather(*(score(c, ids, s) for c, ids, s in zip(choices, full, starts)))
        cached_all = [c for _, _, c in scored]
        cached = None if any(c is None for c in cached_all) else sum(cached_all)  # type: ignore[arg-type]
        best = max(range(len(scored)), key=lambda i: scored[i][0])
        return best, sum(p for _, p, _ in scored), cached, len(scored)
