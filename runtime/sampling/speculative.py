"""Draft-free speculative decoding: prompt lookup (n-gram) drafts, verified in one forward.

RAG answers quote their documents, agents repeat tool output and code, edits copy their input:
the next tokens are often already in the request's own prompt or output. For a decoding
request, the longest recent n-gram (`ngram_max` down to `ngram_min` tokens) that also occurs
earlier in its tokens proposes the tokens that followed that earlier occurrence, up to
`num_draft_tokens`. The step then computes the request's last token and the draft together (one
extend, logits at every position) and chooses a token at every position as plain decoding would
there (`draft_sample_rows`: the same output so far, the same draw counter). The draft's leading
tokens the model chose too are kept, plus the model's own token at the first position where it
differs (or after the last draft token): 1 to k+1 tokens for about the weight reads of one.
Rejected positions' KV slots go back at once (KVManager.verified).

Greedy requests choose the argmax: their output is token for token what decoding one at a time
gives. Sampled requests (temperature, top-k, top-p, min-p) go through standard rejection
sampling for a point-mass draft (runtime/sampler.verify_draft): the draft token at a position is
kept with probability p(d) under that position's distribution, and on the first rejection the
token comes from p with d removed, renormalised; so every emitted token is distributed as plain
sampling's. Each position uses the request's own uniform for that output position, so a seeded
request emits the same tokens with speculation on or off. Penalties, logit bias, min_new_tokens
and logprobs work per position as they do one token at a time. A request with
`speculative: false` in its sampling parameters decodes one token at a time.

A request with a grammar drafts its grammar's forced continuation first (jump-forward,
runtime/sampling/jump_forward.py; on unless --disable-jump-forward), then, with n-gram speculation
on, a prompt-lookup continuation of it cut where the grammar refuses a token. Every draft row's
logits are masked by the grammar as it stands after the draft tokens before it, so the rule above
holds for them too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.sampling.jump_forward import JumpForward, grammar_prefix
from runtime.sampling.sampler import SampleRow
from runtime.step.request import Req


@dataclass(frozen=True)
class SpeculativeConfig:
    num_draft_tokens: int = 4
    ngram_min: int = 1
    ngram_max: int = 3
    disable_by_batch_size: int | None = None  # no drafts in a step with this many decoding requests


def propose(tokens: list[int], config: SpeculativeConfig) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of the longest matching suffix."""
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(config.ngram_max, len(seq) - 1), config.ngram_min - 1, -1):
        suffix = seq[-n:]
        # start positions i < len - n with seq[i:i+n] == suffix (the suffix itself excluded)
        candidates = np.flatnonzero(seq[: len(seq) - n] == suffix[0])
        for i in candidates[::-1]:
            if i + n < len(seq) and np.array_equal(seq[i : i + n], suffix):
                draft = seq[i + n : i + n + config.num_draft_tokens]
                if len(draft):
                    return draft.tolist()
    return []


def may_speculate(req: Req) -> bool:
    """Whether a decoding request may draft: it did not opt out, and its last token is on the host
    (not still in flight from an overlapped step; a grammar's matcher must have accepted it)."""
    return req.params.speculative and not req.inflight


def propose_draft(req: Req, room: int, config: SpeculativeConfig | None,
                  jump_forward: JumpForward | None) -> tuple[list[int], int]:
    """A decoding request's draft of at most `room` tokens, and how many of its leading tokens are
    its grammar's forced continuation (jump-forward); the rest come from prompt lookup."""
    forced = jump_forward.propose(req.grammar, room) if jump_forward is not None and req.grammar is not None else []
    draft = list(forced)
    if config is not None and len(draft) < room:
        more = propose(req.all_ids + draft, config)[: min(config.num_draft_tokens, room - len(draft))]
        if more and req.grammar is not None:  # keep what the grammar allows after the forced run
            more = more[: max(grammar_prefix(req.grammar, draft + more) - len(draft), 0)]
        draft += more
    return draft, len(forced)


def draft_sample_rows(req: Req, draft: list[int]) -> list[SampleRow]:
    """The sampler's rows for a draft being verified: one per draft position plus the one after it,
    each as plain decoding would see that position had the draft before it been kept (the output
    so far, for penalties; the draw counter, for min_new_tokens and the seeded draws), with the
    draft token it verifies."""
    out = req.output_ids
    return [SampleRow(req.params, req.prompt_ids, out + draft[:i], req.seed, drawn=len(out) + i,
                      draft=draft[i] if i < len(draft) else -1) for i in range(len(draft) + 1)]


def accepted(draft: list[int], targets: list[int]) -> int:
    """How many leading draft tokens the model chose too (targets[i]: its choice after draft[:i])."""
    n = 0
    while n < len(draft) and targets[n] == draft[n]:
        n += 1
    return n
