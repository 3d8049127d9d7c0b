"""A step's logits, computed once the step sampler knows which ids each row may take.

The forward ends at the final hidden state of each logit row (runtime/exec/model_runner.py); the
output layer runs when the step sampler materializes the rows (runtime/sampling/step_sampler.py),
after it has filled its constrained rows' grammar bitmasks. A row whose grammar allows only a few
tokens (a JSON key, punctuation, an enum value, a tool's name: runtime/sampling/allowed_ids.py)
gets its logits only at those ids, `hidden . W[ids].T`, and -inf everywhere else: what the full
row masked by the grammar holds, without the other 262k-odd products of a large vocabulary. Every
other row goes through the output layer, all of them in one call.

The allowed-id product is one fixed method per row, whatever else shares the step: the weight
rows as float32 (a GGUF block weight's own `rows`, runtime/cpu/block_weights.py; a dense weight's
rows widened), the hidden row widened to float32, a product summed over the hidden dimension, then
the final softcap where the model has one, as `ModelRunner.compute_logits` applies it. So a row's
logits are the same alone as in any batch, and close to the full row's (the same weights, another
order of sums): greedy fp32 outputs are token for token those of the full rows.

A step whose logits are already computed (a replayed CUDA graph, any step on a GPU, where the
output layer is cheap) is `StepLogits.computed(logits)`: it narrows nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SUM_ELEMENTS = 1 << 21  # weight elements widened at a time by the allowed-id product (8 MB in float32)


class StepLogits:
    """The logit rows of one step: materialized in full, or with some rows only at allowed ids."""

    def __init__(self, hidden: torch.Tensor | None, full: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 weight_rows: Callable[[torch.Tensor], torch.Tensor] | None = None, softcap: float | None = None,
                 width: int = 0, logits: torch.Tensor | None = None) -> None:
        """hidden: [rows, hidden] the final hidden state at each logit row; full: hidden rows -> float32
        logits [rows, vocab] (the output layer, softcapped); weight_rows: ids -> the output weight's
        rows as float32 [len(ids), hidden] (None: this weight cannot narrow); width: the vocabulary
        (the output weight's rows); logits: already computed."""
        self.hidden, self._full, self._weight_rows, self.softcap = hidden, full, weight_rows, softcap
        self.width = logits.shape[1] if logits is not None else width
        self._table = logits
        self._position: list[int] | None = None  # logit row -> its row in the table (None: the same)

    @classmethod
    def computed(cls, logits: torch.Tensor) -> StepLogits:
        return cls(None, logits=logits)

    @property
    def num_rows(self) -> int:
        return self._table.shape[0] if self._table is not None else self.hidden.shape[0]  # type: ignore[union-attr]

    @property
    def narrows(self) -> bool:
        """Whether a row may be materialized at allowed ids only (not yet computed, a weight with rows)."""
        return self._table is None and self._weight_rows is not None

    @torch.inference_mode()
    def materialize(self, allowed: dict[int, torch.Tensor] | None = None, first: list[int] | None = None) -> None:
        """Compute the rows, once. allowed: logit row -> the int64 ids (on the host, each below `width`)
        it may take; such a row holds logits at those ids and -inf elsewhere. first: where rows are
        narrowed, the logit rows to lay out first, in this order (the rows the sampler takes), so
        that `take(first)` is a view and not a copy of a wide table."""
        if self._table is not None:
            return
        assert self.hidden is not None and self._full is not None
        if not allowed or not self.narrows:
            self._table = self._full(self.hidden)
            return
        listed = set(first or ())
        order = list(first or ()) + [r for r in range(self.hidden.shape[0]) if r not in listed]
        self._position = [0] * len(order)
        for at, row in enumerate(order):
            self._position[row] = at
        table = torch.empty(len(order), self.width, dtype=torch.float32, device=self.hidden.device)
        wide = [r for r in order if r not in allowed]
        if wide:
            computed = self._full(self.hidden.index_select(0, _ids(wide, table.device)))
            table.index_copy_(0, _ids([self._position[r] for r in wide], table.device), computed)
        narrow = [r for r in order if r in allowed]
        places = [self._position[r] for r in narrow]
        at = _ids(places, table.device)
        for start, stop in _runs(places):  # slices: index_fill_ over rows was 2x slower than a memset's rate
            table[start:stop].fill_(float("-inf"))
        ids = [allowed[r] for r in narrow]
        counts = torch.tensor([len(i) for i in ids], dtype=torch.int64, device="cpu")
        owner = torch.arange(len(ids), device="cpu").repeat_interleave(counts).to(table.device)
        flat = torch.cat(ids).to(table.device)
        hidden = self.hidden.index_select(0, _ids(narrow, table.device))
        values = allowed_product(hidden, flat, owner, self._weight_rows)  # type: ignore[arg-type]
        if self.softcap:
            values = torch.tanh(values / self.softcap) * self.softcap
        table.index_put_((at.index_select(0, owner), flat), values)
        self._table = table

    def take(self, rows: list[int]) -> torch.Tensor:
        """Float32 logits [len(rows), vocab] of these logit rows, in this order (materialized first)."""
        self.materialize()
        table = self._table
        assert table is not None
        at = rows if self._position is None else [self._position[r] for r in rows]
        if at == list(range(len(at))):  # a leading run of the table: no copy
            return table if len(at) == table.shape[0] else table[: len(at)]
        return table.index_select(0, _ids(at, table.device))

    def row(self, row: int) -> torch.Tensor:
        self.materialize()
        assert self._table is not None
        return self._table[row if self._position is None else self._position[row]]

    def span(self, start: int, count: int) -> torch.Tensor:
        """Logit rows start .. start + count - 1."""
        self.materialize()
        assert self._table is not None
        if self._position is None:
            return self._table[start : start + count]
        return self.take(list(range(start, start + count)))


def allowed_product(hidden: torch.Tensor, ids: torch.Tensor, owner: torch.Tensor,
                    weight_rows: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """hidden[owner[j]] . W[ids[j]] for every j, in float32. Each value is its own sum over the
    hidden dimension, computed the same way however many rows and ids share the call (which only
    sets how many weight rows are widened at a time)."""
    wide = hidden.float()
    step = max(1, SUM_ELEMENTS // max(hidden.shape[1], 1))
    parts = [(weight_rows(ids[s : s + step]) * wide.index_select(0, owner[s : s + step])).sum(-1)
             for s in range(0, ids.numel(), step)]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float32, device=hidden.device)


def weight_rows_of(weight: object) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """ids -> the output weight's rows as float32: a tensor's rows widened, a block weight's own
    `rows` (runtime/cpu/block_weights.py). None where the weight cannot give rows back (torch's
    int4 layout): its rows then always go through the output layer."""
    if isinstance(weight, torch.Tensor):
        return lambda ids: weight.index_select(0, ids).float()
    rows = getattr(weight, "rows", None)
    if rows is None:
        return None
    try:
        rows(torch.zeros(1, dtype=torch.int64, device="cpu"), torch.float32)
    except NotImplementedError:
        return None
    return lambda ids: rows(ids, torch.float32)


def _runs(places: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct row places as [start, stop) runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for place in sorted(places):
        if runs and runs[-1][1] == place:
            runs[-1] = (runs[-1][0], place + 1)
        else:
            runs.append((place, place + 1))
    return runs


def _ids(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device="cpu").to(device)
