"""The five headline serving figures, measured the same way against any OpenAI-compatible server.

Figures (`../shared/PEERS.md` defines them; each is the median of `trials`):
- prompt_tok_s: one unique ~500-token prompt, max_tokens 1: prompt tokens / s;
- one_stream_tok_s: one streamed request of 128 tokens: tokens / s after the first;
- streams16_tok_s: 16 concurrent requests x 64 tokens: generated tokens / s in all;
- resend_s: the previous ~500-token prompt sent again, max_tokens 1: seconds;
- shared_prefix_req_s: 32 requests in 4 groups behind a ~400-token system prompt, 8 at a time;
- rag_one_stream_tok_s: one streamed request of 128 tokens after a ~1,500-token document, answering
  with a quote of it (benchmarks/speculative.py's workload): tokens / s after the first.
With a busy neighbour (`busy_figures`, while `neighbour()` spins on one core in a session of its own):
- one_stream_busy_tok_s and streams16_busy_tok_s: the one-stream and 16-stream figures again.
Prompts are words, counted by the server (`usage`); every server sees the same text. Traffic goes
only to the given URL (127.0.0.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from benchmarks.speculative import rag_prompt

WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls watch from old oak trees near the "
         "river bank as morning light spreads across quiet fields and distant hills").split()


def text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Client:
    def __init__(self, base_url: str, model: str, timeout: float = 600.0) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self.model = model

    async def complete(self, prompt: str, max_tokens: int) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}
        response = await self.http.post("/completions", json=body)
        response.raise_for_status()
        return response.json()

    async def stream_rate(self, prompt: str, max_tokens: int) -> float:
        """Tokens per second after the first of one streamed request."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        first = None
        chunks = 0
        async with self.http.stream("POST", "/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunks += 1
                if first is None:
                    first = time.perf_counter()
        end = time.perf_counter()
        # One chunk per token on every server measured (the servers stream token by token).
        return (chunks - 1) / (end - first) if first is not None and chunks > 1 else 0.0

    async def close(self) -> None:
        await self.http.aclose()


async def _prompt_and_resend(client: Client, trial: int) -> tuple[float, float]:
    prompt = text(460, seed=1000 + trial)  # ~500 tokens with the default model's tokenizer
    start = time.perf_counter()
    out = await client.complete(prompt, 1)
    prompt_rate = out["usage"]["prompt_tokens"] / (time.perf_counter() - start)
    start = time.perf_counter()
    await client.complete(prompt, 1)
    return prompt_rate, time.perf_counter() - start


async def _streams(client: Client, count: int, tokens: int, trial: int) -> float:
    prompts = [text(24, seed=2000 + 100 * trial + i) for i in range(count)]
    start = time.perf_counter()
    outs = await asyncio.gather(*(client.complete(p, tokens) for p in prompts))
    return sum(o["usage"]["completion_tokens"] for o in outs) / (time.perf_counter() - start)


async def _shared_prefix(client: Client, trial: int, groups: int = 4, per_group: int = 8,
                         concurrency: int = 8) -> float:
    systems = [text(360, seed=3000 + 10 * trial + g) for g in range(groups)]
    prompts = [f"{systems[g]}\nQuestion {i}: {text(12, seed=4000 + 100 * trial + 10 * g + i)}\nAnswer:"
               for g in range(groups) for i in range(per_group)]
    random.Random(trial).shuffle(prompts)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> None:
        async with gate:
            await client.complete(prompt, 16)

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in prompts))
    return len(prompts) / (time.perf_counter() - start)


async def trial_figures(client: Client, trial: int) -> dict[str, float]:
    """One trial of every figure on one system (its prompts seeded by `trial`)."""
    prompt_rate, resend = await _prompt_and_resend(client, trial)
    return {"prompt_tok_s": prompt_rate, "resend_s": resend,
            "one_stream_tok_s": await client.stream_rate(text(24, seed=5000 + trial), 128),
            "streams16_tok_s": await _streams(client, 16, 64, trial),
            "shared_prefix_req_s": await _shared_prefix(client, trial),
            "rag_one_stream_tok_s": await client.stream_rate(rag_prompt(seed=trial), 128)}


async def measure(base_url: str, model: str, trials: int = 3) -> dict[str, float]:
    client = Client(base_url, model)
    try:
        await client.complete(text(16, seed=1), 4)  # warm-up
        samples = [await trial_figures(client, trial) for trial in range(trials)]
        return medians(samples)
    finally:
        await client.close()


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over trials."""
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


async def one_trial(base_url: str, model: str, trial: int, busy: bool = False, warm: bool = False) -> dict[str, float]:
    """One trial of one system's figures (the busy ones: one stream and 16 streams), over a client of
    its own: benchmarks/peers.py `--interleave` alternates systems trial by trial."""
    client = Client(base_url, model)
    try:
        if warm:
            await client.complete(text(16, seed=1), 4)
        if busy:
            return await busy_trial(client, trial)
        return await trial_figures(client, trial)
    finally:
        await client.close()


def run(base_url: str, model: str, trials: int = 3) -> dict[str, float]:
    return asyncio.run(measure(base_url, model, trials))


@contextlib.contextmanager
def neighbour() -> Iterator[None]:
    """One other process spinning on one core, in a session of its own (as a service's neighbour is)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        time.sleep(1.0)
        yield
    finally:
        proc.kill()
        proc.wait()


async def busy_trial(client: Client, trial: int) -> dict[str, float]:
    return {"one_stream_busy_tok_s": await client.stream_rate(text(24, seed=9000 + trial), 128),
            "streams16_busy_tok_s": await _streams(client, 16, 64, 50 + trial)}


async def measure_busy(base_url: str, model: str, trials: int = 3) -> dict[str, float]:
    client = Client(base_url, model)
    try:
        return medians([await busy_trial(client, trial) for trial in range(trials)])
    finally:
        await client.close()


def busy_figures(base_url: str, model: str, trials: int = 3) -> dict[str, float]:
    with neighbour():
        return asyncio.run(measure_busy(base_url, model, trials))
