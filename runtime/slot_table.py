"""The request-to-slots table: row r, column i holds the KV slot of token i of the request in row r.

A running request owns one row for its lifetime; attention reads a batch's rows directly, so
building a decode step's gather table is one indexing operation, not a Python loop.
"""

from __future__ import annotations

import torch


class ReqSlotTable:
    def __init__(self, max_requests: int, max_context: int) -> None:
        self.max_context = max_context
        self.table = torch.zeros((max_requests, max_context), dtype=torch.int64)
        self._free_rows = list(range(max_requests - 1, -1, -1))

    def available(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        if not self._free_rows:
            raise RuntimeError("no free row in the request-to-slots table")
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start : start + len(slots)] = slots

    def read(self, row: int, length: int) -> torch.Tensor:
        return self.table[row, :length]
