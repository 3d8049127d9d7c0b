"""Batched sampling on the logits' device: penalties, temperature, top-k / top-p / min-p, logprobs.

Every operation is over the whole batch (or the subset of rows that need it), never a Python
loop over rows on the device, and the step ends with one device-to-host copy of the chosen ids
(plus one of logprobs when a request asked for them).

Randomness is counter-based: request r's draw for its n-th output token is a uniform number
hashed from (r's seed, n) on the host, and the token is found by inverting that row's
cumulative distribution. So a seeded request gives the same tokens whatever else shares its
batch, on the CPU and on a GPU alike, with no per-request generator.

A row may verify a prompt-lookup draft token (`SampleRow.draft`): `verify_draft` is the
rejection rule that keeps sampled requests' distribution under speculation (runtime/sampling/speculative.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from runtime.output import TokenLogprob
from runtime.sampling.argmax import argmax_rows
from runtime.sampling_params import SamplingParams

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def uniforms(seeds: list[int], counters: list[int]) -> np.ndarray:
    """A uniform number in [0, 1) per (seed, counter): splitmix64 of the pair, 24 bits of it (fp32-exact)."""
    with np.errstate(over="ignore"):
        x = np.array(seeds, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x ^= np.array(counters, dtype=np.uint64) + np.uint64(0x632BE59BD9B4E019)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9) & M64
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB) & M64
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(40)).astype(np.float64) / float(1 << 24)


@dataclass
class SampleRow:
    """What the sampler needs from one request for this step."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    seed: int
    drawn: int | None = None  # tokens drawn before this one (default: len(output_ids)); counts in-flight ones
    draft: int = -1  # the drafted token this row's position verifies (-1: none; runtime/sampling/speculative.py)

    @property
    def draw(self) -> int:
        return len(self.output_ids) if self.drawn is None else self.drawn


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float | None]  # of the chosen token under the raw distribution, when asked
    top_logprobs: list[list[TokenLogprob] | None]


def has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def adjusts_logits(row: SampleRow) -> bool:
    return bool(row.params.logit_bias) or row.draw < row.params.min_new_tokens


def apply_bias_and_min_tokens(logits: torch.Tensor, rows: list[SampleRow], stop_ids: set[int]) -> torch.Tensor:
    """Add each row's logit_bias; before min_new_tokens, mask EOS and the row's stop tokens.

    logits: [B, V] for exactly these rows (returned changed). A row the mask would leave with no
    token at all (a constraint that only allows EOS) keeps its logits unmasked.
    """
    vocab = logits.shape[-1]
    bias_at: tuple[list[int], list[int]] = ([], [])
    bias_values: list[float] = []
    mask_at: tuple[list[int], list[int]] = ([], [])
    for i, row in enumerate(rows):
        for token, value in (row.params.logit_bias or {}).items():
            if token < vocab:
                bias_at[0].append(i)
                bias_at[1].append(token)
                bias_values.append(float(value))
        if row.draw < row.params.min_new_tokens:
            banned = sorted(t for t in stop_ids | set(row.params.stop_token_ids) if t < vocab)
            mask_at[0].extend([i] * len(banned))
            mask_at[1].extend(banned)
    device = logits.device
    if bias_values:
        index = (device_ids(bias_at[0], device), device_ids(bias_at[1], device))
        logits = logits.index_put(index, _column(bias_values, device)[:, 0], accumulate=True)
    if mask_at[0]:
        index = (device_ids(mask_at[0], device), device_ids(mask_at[1], device))
        masked = logits.index_put(index, torch.tensor(float("-inf"), device=device))
        usable = torch.isfinite(masked).any(dim=-1, keepdim=True)
        logits = torch.where(usable, masked, logits)
    return logits


def device_ids(values: list[int], device: torch.device) -> torch.Tensor:
    """Host ints as an int64 tensor on `device` (made on the host, then copied: one explicit upload)."""
    return torch.tensor(values, dtype=torch.int64, device="cpu").to(device)


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device="cpu").to(device, non_blocking=True)[:, None]


def _token_counts(histories: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(histories), vocab] counts of each token id, built on the device from one padded upload."""
    width = max((len(h) for h in histories), default=0)
    ids = torch.full((len(histories), max(width, 1)), vocab, dtype=torch.int64, device="cpu")  # vocab = padding
    for i, h in enumerate(histories):
        ids[i, : len(h)] = torch.tensor(h, dtype=torch.int64, device="cpu")
    ids = ids.to(device)
    counts = torch.zeros((len(histories), vocab + 1), dtype=torch.float32, device=device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    """OpenAI frequency/presence penalties over the output; HF repetition penalty over prompt + output.

    logits: [B, V] for exactly these rows (modified in place and returned).
    """
    device, vocab = logits.device, logits.shape[-1]
    params = [r.params for r in rows]
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = _token_counts([r.prompt_ids + r.output_ids for r in rows], vocab, device) > 0
        penalty = _column([p.repetition_penalty for p in params], device)
        scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
        logits = torch.where(seen, scaled, logits)
    if any(p.frequency_penalty or p.presence_penalty for p in params):
        counts = _token_counts([r.output_ids for r in rows], vocab, device)
        logits -= (_column([p.frequency_penalty for p in params], device) * counts
                   + _column([p.presence_penalty for p in params], device) * (counts > 0).float())
    return logits


def filter_probs(probs: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float]) -> torch.Tensor:
    """Zero what top-k, min-p and top-p (nucleus) rule out, per row, in that order. probs: [B, V]."""
    device, vocab = probs.device, probs.shape[-1]
    if any(0 < k < vocab for k in top_k):
        ks = [k if 0 < k < vocab else vocab for k in top_k]
        kth = probs.topk(max(ks), dim=-1).values.gather(
            1, device_ids(ks, device)[:, None] - 1)
        probs = torch.where(probs < kth, 0.0, probs)
    if any(m > 0 for m in min_p):
        floor = _column(min_p, device) * probs.max(dim=-1, keepdim=True).values
        probs = torch.where(probs < floor, 0.0, probs)
    if any(p < 1.0 for p in top_p):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly ahead of each token
        sorted_probs = torch.where(before > _column(top_p, device) * sorted_probs.sum(-1, keepdim=True), 0.0,
                                   sorted_probs)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return probs


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the token where the (unnormalised) cumulative mass first exceeds u * total."""
    cdf = probs.cumsum(-1)
    target = u[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)
    # Rounding can land past the last token with mass (u close to 1): take the likeliest instead.
    empty = probs.gather(1, picked) <= 0
    return torch.where(empty, argmax_rows(probs)[:, None], picked).squeeze(1)


def verify_draft(probs: torch.Tensor, draft: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Standard rejection sampling of a deterministic draft, one row per drafted position.

    probs: [N, V] the target distribution p at each position (after temperature and the filters,
    unnormalised is fine); draft: [N] int64 the drafted token d there (-1 for none: the position
    after the last draft token); u: [N] the request's uniform for that output position.
    Returns (tokens, accepted), both [N]: accepted[i] says d_i is kept; where it is not, tokens[i]
    is the draw that replaces it. The caller keeps each request's leading accepted positions and
    the token at its first rejected one (or at its draft-free last one), and stops there.

    The draft is a point mass, q(d) = 1, so the standard rule (accept with probability
    min(1, p(d) / q(d)), else draw from norm(max(0, p - q))) is: accept d with probability p(d),
    else draw from p with d removed, renormalised. One inverse-CDF draw does both: u falls in d's
    interval of the CDF with probability p(d) (the token drawn is d: accept); otherwise the token
    whose interval holds it is, given that, distributed as p without d (the residual). p(d) = 0
    gives d an empty interval: never accepted. And the draw is the very one plain sampling makes
    at that position with the same u, so a seeded request emits the same tokens with speculation
    on or off. Greedy rows are the same rule with p a point mass on the argmax.
    """
    tokens = inverse_cdf(probs, u)
    return tokens, tokens == draft


class PendingSample:
    """A step's chosen tokens: on the device at once (`ids`, what the next step may read), and on
    their way to the host in one copy (`result()` waits for it)."""

    def __init__(self, ids: torch.Tensor, payload: torch.Tensor, unpack: Callable[[list[float]], SampleResult]) -> None:
        self.ids = ids
        self._unpack = unpack
        self._event = None
        if payload.device.type == "cuda":
            self._host = torch.empty(payload.shape, dtype=payload.dtype, device="cpu", pin_memory=True)
            self._host.copy_(payload, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = payload

    def result(self) -> SampleResult:
        if self._event is not None:
            self._event.synchronize()
        return self._unpack(self._host.tolist())


class Sampler:
    def __init__(self, stop_token_ids: set[int] | None = None) -> None:
        self.stop_token_ids = set(stop_token_ids or ())  # the model's EOS ids: masked before min_new_tokens

    def sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> SampleResult:
        """logits: float32 [B, V] raw scores, one row per entry of `rows`. Returns the chosen ids."""
        return self.sample_async(logits, rows).result()

    def sample_async(self, logits: torch.Tensor, rows: list[SampleRow]) -> PendingSample:
        """As `sample`, without waiting for the host: the copy back is started, not awaited."""
        params = [r.params for r in rows]
        tokens = self._choose(logits, rows)
        n = len(rows)
        wanted = [i for i, p in enumerate(params) if p.return_logprob]
        if not wanted:
            return PendingSample(tokens, tokens, lambda host: SampleResult([int(t) for t in host], [None] * n,
                                                                          [None] * n))
        idx = device_ids(wanted, logits.device)
        logp = torch.log_softmax(logits[idx], dim=-1)
        chosen = logp.gather(1, tokens[idx][:, None]).squeeze(1)
        k = max(params[i].top_logprobs_num for i in wanted)
        top_values, top_ids = logp.topk(k, dim=-1)  # k == 0 gives [w, 0]: nothing to copy
        # One copy back for everything this step produced.
        payload = torch.cat([tokens.double(), chosen.double(), top_values.double().flatten(),
                             top_ids.double().flatten()])
        return PendingSample(tokens, payload, lambda host: _unpack_logprobs(host, params, wanted, k))

    def _choose(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        params = [r.params for r in rows]
        penalised = [i for i, p in enumerate(params) if has_penalty(p)]
        if penalised:
            logits = logits.clone()
            idx = device_ids(penalised, logits.device)
            logits[idx] = apply_penalties(logits[idx], [rows[i] for i in penalised])
        adjusted = [i for i, r in enumerate(rows) if adjusts_logits(r)]
        if adjusted:
            logits = logits.clone() if not penalised else logits
            idx = device_ids(adjusted, logits.device)
            logits[idx] = apply_bias_and_min_tokens(logits[idx], [rows[i] for i in adjusted], self.stop_token_ids)
        tokens = argmax_rows(logits)  # greedy rows are done
        random = [i for i, p in enumerate(params) if not p.greedy]
        if random:
            device = logits.device
            idx = device_ids(random, device)
            sub = [params[i] for i in random]
            temps = _column([p.temperature for p in sub], device)
            scaled = logits[idx] / temps
            # A huge logit bias over a small temperature can still overflow: keep the row finite
            # (-inf stays -inf: tokens a grammar masks out must keep probability 0).
            scaled = torch.nan_to_num_(scaled, nan=float("-inf"), posinf=torch.finfo(scaled.dtype).max,
                                       neginf=float("-inf"))
            probs = torch.softmax(scaled, dim=-1)
            probs = filter_probs(probs, [p.top_k for p in sub], [p.top_p for p in sub], [p.min_p for p in sub])
            u = uniforms([rows[i].seed for i in random], [rows[i].draw for i in random])
            draws = torch.from_numpy(u.astype(np.float32)).to(device)
            # For a row that verifies a draft token this one draw is also the rejection rule
            # (verify_draft); the host reads the verdict back as token == draft (speculative.accepted).
            tokens = tokens.index_copy(0, idx, inverse_cdf(probs, draws))
        return tokens


def _unpack_logprobs(host: list[float], params: list[SamplingParams], wanted: list[int], k: int) -> SampleResult:
    n, w = len(params), len(wanted)
    token_ids = [int(t) for t in host[:n]]
    chosen_h = host[n : n + w]
    tv, ti = host[n + w : n + w + w * k], host[n + w + w * k :]
    logprobs: list[float | None] = [None] * n
    tops: list[list[TokenLogprob] | None] = [None] * n
    for j, i in enumerate(wanted):
        logprobs[i] = chosen_h[j]
        kk = params[i].top_logprobs_num
        if kk:
            tops[i] = [(tv[j * k + c], int(ti[j * k + c])) for c in range(kk)]
    return SampleResult(token_ids, logprobs, tops)


def prompt_logprobs(logits: torch.Tensor, next_ids: list[int], top_k: int) -> tuple[list[float], list[list[TokenLogprob]]]:
    """Logprob of each next_ids[j] under logits[j] (the position before it), and the top-k there."""
    logp = torch.log_softmax(logits, dim=-1)
    ids = device_ids(next_ids, logits.device)
    chosen = logp.gather(1, ids[:, None]).squeeze(1).tolist()
    tops: list[list[TokenLogprob]] = []
    if top_k:
        values, idx = logp.topk(top_k, dim=-1)
        tops = [list(zip(v, t)) for v, t in zip(values.tolist(), idx.tolist())]
    return chosen, tops
