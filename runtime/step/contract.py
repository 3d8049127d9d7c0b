"""The step contract: what passes between plan -> forward -> sample -> process.

- The scheduler plans a step as a `StepPlan`: requests and their `BatchEntry`s, in kernel order.
- The model runner lays the entries out in the packed layout below (runtime/step/forward_batch.py),
  uploads it in one copy and computes logits (eagerly, or by replaying a CUDA graph whose static
  buffer has the same layout: runtime/exec/graph_runner.py).
- The step sampler (runtime/sampling/step_sampler.py) turns the logits into `StepOutputs`: prompt
  logprobs and chosen tokens, which may still be on the device.
- The output processor (runtime/step/output_processor.py) applies them to the requests.

A decode entry may name a `future` token instead of a known one: the id the previous step
sampled on the device, which the host has not read yet (the overlap scheduler plans step n+1
before step n's ids come back). Its id in `token_ids` is the placeholder FUTURE, and the upload
copies the real id in on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from runtime.sampling.pooling import PooledRows
    from runtime.sampling.sampler import PendingSample
    from runtime.step.request import Req

FUTURE = -1  # the placeholder id of a token still on the device (BatchEntry.future says which)


@dataclass(slots=True)
class BatchEntry:
    row: int  # the request's row in the request-to-slots table
    prefix_len: int  # tokens whose KV is already in the pool
    token_ids: list[int]  # the new tokens, at positions prefix_len, prefix_len + 1, ...
    logits_from: int | None = None  # also return logits of new-token offsets >= this
    future: int | None = None  # token_ids[-1] is the previous step's sampled id number `future`
    draft: int = 0  # the last `draft` tokens are proposals to verify (runtime/sampling/speculative.py)
    forced: int = 0  # of those, how many lead with the grammar's forced continuation (sampling/jump_forward.py)
    keep_hidden: bool = False  # a pooling request: the step also returns every new token's hidden state
    lora: object | None = None  # the request's LoRA adapter (runtime/lora/registry.py: LoadedAdapter); None: base


# The packed layout of a step: one int64 tensor holding these sections, in this order. Sizes are
# in T (new tokens), B (requests), R (logit rows) and F (future tokens). The body is what a
# CUDA-graph buffer holds and what every forward reads; the future sections are read once, at
# upload, to copy the previous step's ids into `input_ids`.
PACKED_LAYOUT: tuple[tuple[str, str], ...] = (
    ("input_ids", "T"),
    ("positions", "T"),
    ("rows", "B"),  # table rows
    ("int_columns", "3B"),  # seq lens, prefix lens, query starts (AttentionMetadata.host_int_lists)
    ("logit_rows", "R"),
    ("out_slots", "T"),  # where each new token's K/V goes
    ("future_dst", "F"),  # token rows whose id is a future
    ("future_src", "F"),  # their indices in the previous step's sampled ids
)
BODY_SECTIONS = 6  # the first six sections


def section_sizes(tokens: int, reqs: int, logit_rows: int, futures: int, body_only: bool = False) -> list[int]:
    """The length of each section of PACKED_LAYOUT for a step of these sizes."""
    units = {"T": tokens, "B": reqs, "R": logit_rows, "F": futures}
    layout = PACKED_LAYOUT[:BODY_SECTIONS] if body_only else PACKED_LAYOUT
    return [int(size[:-1] or 1) * units[size[-1]] for _, size in layout]


def pack_sections(values: dict[str, list[int] | torch.Tensor]) -> torch.Tensor:
    """One int64 host tensor of every section of PACKED_LAYOUT, in order. Consecutive list
    sections become one tensor together (one conversion, not one per section)."""
    parts: list[torch.Tensor] = []
    run: list[int] = []
    for name, _ in PACKED_LAYOUT:
        value = values[name]
        if isinstance(value, torch.Tensor):
            if run:
                parts.append(torch.tensor(run, dtype=torch.int64, device="cpu"))
                run = []
            parts.append(value.to(torch.int64))
        else:
            run += value
    parts.append(torch.tensor(run, dtype=torch.int64, device="cpu"))
    return torch.cat(parts)


@dataclass
class StepPlan:
    """The requests of one step and their new tokens, in kernel order: several-token entries
    (prefills, chunks) first, then one-token entries (decodes), whatever order they were planned in."""

    _extends: list[tuple[Req, BatchEntry]] = field(default_factory=list)
    _decodes: list[tuple[Req, BatchEntry]] = field(default_factory=list)
    # Requests whose whole prompt was cached with its last position's logits (runtime/kv/last_logits.py):
    # their first token is sampled from the kept row, with no entry in the forward.
    ready: list[tuple[Req, torch.Tensor]] = field(default_factory=list)

    def add(self, req: Req, num_tokens: int, logits_from: int | None = None) -> None:
        assert req.row is not None
        if req.inflight:  # a decode of the token the previous step sampled: its id is still on the device
            assert num_tokens == 1 and req.kv_len == req.seq_len
            self._put(req, BatchEntry(req.row, req.kv_len, [FUTURE], logits_from, future=req.inflight_index,
                                      lora=req.lora))
            return
        tokens = [req.token_at(req.kv_len)] if num_tokens == 1 else req.all_ids[req.kv_len : req.kv_len + num_tokens]
        assert len(tokens) == num_tokens
        self._put(req, BatchEntry(req.row, req.kv_len, tokens, logits_from, keep_hidden=req.pooling is not None,
                                  lora=req.lora))

    def add_draft(self, req: Req, draft: list[int], forced: int = 0) -> None:
        """A decode with proposed next tokens: the last known token and the draft, logits at each;
        the draft's first `forced` tokens are its grammar's forced continuation."""
        assert req.row is not None and not req.inflight and req.kv_len == req.seq_len - 1
        self._put(req, BatchEntry(req.row, req.kv_len, [req.token_at(req.kv_len), *draft], 0, draft=len(draft),
                                  forced=forced, lora=req.lora))

    def add_ready(self, req: Req, logits: torch.Tensor) -> None:
        assert req.row is not None and req.kv_len == req.seq_len
        self.ready.append((req, logits))

    def _put(self, req: Req, entry: BatchEntry) -> None:
        (self._extends if len(entry.token_ids) > 1 else self._decodes).append((req, entry))

    def drop(self, req: Req) -> None:
        self._extends = [(r, e) for r, e in self._extends if r is not req]
        self._decodes = [(r, e) for r, e in self._decodes if r is not req]
        self.ready = [(r, row) for r, row in self.ready if r is not req]

    @classmethod
    def of(cls, req: Req, entry: BatchEntry) -> StepPlan:
        plan = cls()
        plan._put(req, entry)
        return plan

    @property
    def reqs(self) -> list[Req]:
        return [r for r, _ in self._extends + self._decodes]

    @property
    def entries(self) -> list[BatchEntry]:
        return [e for _, e in self._extends + self._decodes]

    def __contains__(self, req: Req) -> bool:
        return any(r is req for r, _ in self._extends + self._decodes + self.ready)

    def __bool__(self) -> bool:
        return bool(self._extends or self._decodes or self.ready)


@dataclass
class StepOutputs:
    """What one forward step produced, before any request is changed (its tokens may still be on
    their way from the device: `result` is read only when the step is completed)."""

    prompt_logprobs: list[tuple[Req, list, list]] = field(default_factory=list)  # (req, values, tops)
    sampled_reqs: list[Req] = field(default_factory=list)  # requests that reached their last prompt token
    generating: list[Req] = field(default_factory=list)  # of those, the ones that sample a token (ready ones last)
    # Decodes verifying drafts: (req, draft, how many of its leading tokens the grammar forced).
    drafts: list[tuple[Req, list[int], int]] = field(default_factory=list)
    pooled: list[tuple[Req, PooledRows]] = field(default_factory=list)  # pooling requests' rows (sampling/pooling.py)
    # Rows of `result`: one per generating request, then 1 + len(draft) per drafting one.
    result: PendingSample | None = None
