"""What bounds one decode stream: bytes a token reads, the machine's measured bandwidth, peak RSS.

For `benchmarks/real_shapes.py`:
- `bytes_per_token(gguf)`: the weight bytes one decode step reads from a GGUF as shipped: every
  tensor but the embedding (one row of it is read; a tied embedding is read whole as the output
  layer), expert tensors at experts_used / expert_count of their size (the routed experts only).
  The KV cache read (short contexts here) is left out.
- `stream_bandwidth()`: a copy of 512 MiB by torch on every core (best of five), counted as bytes
  read + written per second (STREAM's "copy"; the write-allocate reads are not counted, so it
  understates the traffic), a read-only sum of the same buffer, and a float32 matrix-vector
  product over 512 MiB of matrix (the read a decode step does).
- `peak_rss(pid)`: VmHWM (the kernel's high-water mark of resident memory) of the process and any
  children it has.
"""

from __future__ import annotations

import time
from pathlib import Path


def bytes_per_token(gguf: Path) -> int:
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    arch = str(reader.fields["general.architecture"].contents())
    count = reader.fields.get(f"{arch}.expert_count")
    used = reader.fields.get(f"{arch}.expert_used_count")
    share = int(used.contents()) / int(count.contents()) if count is not None and used is not None else 1.0
    names = {t.name for t in reader.tensors}
    total = 0.0
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight" and "output.weight" in names:
            continue  # one row per token
        total += int(tensor.n_bytes) * (share if "_exps." in tensor.name else 1.0)
    return int(total)


def stream_bandwidth(mib: int = 512, repeats: int = 5) -> dict[str, float]:
    import torch

    count = mib * 2**20 // 4
    source = torch.ones(count, dtype=torch.float32)
    target = torch.empty_like(source)
    copy, read = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        copy.append(time.perf_counter() - start)
        start = time.perf_counter()
        float(source.sum())
        read.append(time.perf_counter() - start)
    size = count * 4
    matrix = source.view(8192, -1)
    vector = torch.ones(matrix.shape[1])
    gemv = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mv(matrix, vector)
        gemv.append(time.perf_counter() - start)
    return {"copy_gb_s": 2 * size / min(copy) / 1e9, "read_gb_s": size / min(read) / 1e9,
            "gemv_read_gb_s": size / min(gemv) / 1e9,
            "buffer_mib": mib, "threads": torch.get_num_threads()}


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def peak_rss(pid: int) -> int:
    """Bytes: VmHWM of `pid` plus that of every descendant still alive."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
        if line is not None:
            total += int(line.split()[1]) * 1024
        todo += _children(current)
    return total
