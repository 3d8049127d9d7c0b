"""The request-to-slots table: row r, column i holds the KV slot of token i of the request in row r.

A running request owns one row for its lifetime; attention reads a batch's rows directly, so a
step's KV addresses are one lookup, not a Python loop.

Two copies with one owner: the host table is what the scheduler and the cache bookkeeping read
and write (reads never wait on a GPU), and `device_table` is what the kernels read. On the CPU
they are the same tensor. On a GPU, writes are logged and `sync()` applies all of a step's
writes with one upload and one scatter, before the step's forward.

One row past `max_requests`, `pad_row`, belongs to no request: the padding rows of a CUDA-graph
decode batch read it (runtime/exec/graph_runner.py). Its first column holds the pool's pad slot, so a
padding request reads and writes only that slot.
"""

from __future__ import annotations

import torch


class ReqSlotTable:
    def __init__(self, max_requests: int, max_context: int, device: torch.device | str = "cpu",
                 pad_slot: int = 0) -> None:
        self.max_context = max_context
        self.device = torch.device(device)
        self.pad_row = max_requests
        self.table = torch.zeros((max_requests + 1, max_context), dtype=torch.int64, device="cpu")
        self.device_table = self.table if self.device.type == "cpu" else self.table.to(self.device)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # (rows, columns, slots) not yet on the device
        self._free_rows = list(range(max_requests - 1, -1, -1))
        self.table[self.pad_row, 0] = pad_slot
        self.device_table[self.pad_row, 0] = pad_slot

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
        if self.device_table is not self.table and len(slots):
            n = len(slots)
            self._pending.append((torch.full((n,), row, dtype=torch.int64), torch.arange(start, start + n),
                                  slots.to(torch.int64)))

    def write_scattered(self, rows: list[int], columns: list[int], slots: torch.Tensor) -> None:
        """table[rows[i], columns[i]] = slots[i] for every i, in one write (a step's decode growth)."""
        rows_t = torch.tensor(rows, dtype=torch.int64, device="cpu")
        columns_t = torch.tensor(columns, dtype=torch.int64, device="cpu")
        self.table[rows_t, columns_t] = slots
        if self.device_table is not self.table and len(slots):
            self._pending.append((rows_t, columns_t, slots.to(torch.int64)))

    def read(self, row: int, length: int) -> torch.Tensor:
        return self.table[row, :length]

    def gather(self, rows: list[int], columns: list[int]) -> torch.Tensor:
        """table[rows[i], columns[i]] for every i, in one lookup (on the host)."""
        return self.table[torch.tensor(rows, dtype=torch.int64, device="cpu"),
                          torch.tensor(columns, dtype=torch.int64, device="cpu")]

    def sync(self) -> None:
        """Bring the device copy up to date: one host-to-device copy and one scatter for all writes."""
        if not self._pending:
            return
        rows, cols, values = (torch.cat(part) for part in zip(*self._pending))
        self._pending.clear()
        packed = torch.stack([rows, cols, values]).to(self.device)
        self.device_table[packed[0], packed[1]] = packed[2]
