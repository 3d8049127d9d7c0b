"""`--dtype auto` on the CPU: chosen at startup from what the cores can do, by a short measurement.

No single dtype wins everywhere (docs/benchmarks.md has the peers' figures per CPU kind): on CPUs with bf16 units (AVX-512 bf16,
AMX) bf16 matmul is 2-7x faster than fp32 and bf16 wins every figure; on AVX2-only CPUs torch's
bf16 matmul runs at a sixth of fp32's rate, so fp32 wins prompt processing and batched decoding,
while one stream, which only reads weights, still runs nearly twice as fast from bf16 weights
(half the bytes). So `auto` measures a matrix-matrix product (128 rows) and a matrix-vector one
(1-16 rows) in both dtypes, on the model's own widths, and picks:
- bf16, where bf16 matrix-matrix work is at least BF16_GEMM_SHARE of fp32's rate;
- otherwise fp32 activations and weights, plus bf16 copies of the weights used for products with
  at most `lowp_rows` rows, where those measured faster in bf16 (runtime/cpu/dual_linear.py).
The choice and its figures are logged (and in /get_server_info's `dtype_choice`). The engine is
built on one intra-op thread (runtime/cpu/host_threads.py), so the rates are one core's: what is
compared is the ratio between dtypes, a property of the cores. So the rates are measured once per
kind of CPU, torch version and width, and kept in `$RADIXSERVE_HOME/cpu-precision/` (the second
start of a 1B model skips 0.8 s of measuring, a 7B's 1.6 s); delete a file there to measure
again. On CUDA `auto` is bf16.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)
BF16_GEMM_SHARE = 0.7
GEMV_ROWS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class MatmulRates:
    """GFLOP/s of F.linear on this CPU: rows -> rate, per dtype."""

    bf16: dict[int, float]
    fp32: dict[int, float]


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype  # activations, KV cache, and the weights of matrix-matrix work
    lowp_rows: int = 0  # products with at most this many rows use bf16 weight copies (0: none)
    reason: str = ""
    # What `auto` measured on this CPU (None when the dtype was given or on a GPU): tests check
    # the choice against `choose(rates)` instead of assuming one kind of CPU.
    rates: MatmulRates | None = field(default=None, compare=False)


def _rate(rows: int, width: int, out: int, dtype: torch.dtype, budget_s: float) -> float:
    gen = torch.Generator(device="cpu").manual_seed(rows)
    x = torch.randn(rows, width, generator=gen, device="cpu").to(dtype)
    w = torch.randn(out, width, generator=gen, device="cpu").to(dtype)
    F.linear(x, w)  # first call: allocation and kernel selection
    best, spent, calls = float("inf"), 0.0, 0
    while spent < budget_s or calls < 3:
        start = time.perf_counter()
        F.linear(x, w)
        elapsed = time.perf_counter() - start
        best, spent, calls = min(best, elapsed), spent + elapsed, calls + 1
    return 2 * rows * width * out / best / 1e9


def measure_rates(width: int = 640, out: int = 4096, budget_s: float = 0.02) -> MatmulRates:
    """About half a second: one matrix-matrix shape and the small-row shapes, both dtypes."""
    rows = (*GEMV_ROWS, 128)
    return MatmulRates({r: _rate(r, width, out, torch.bfloat16, budget_s) for r in rows},
                       {r: _rate(r, width, out, torch.float32, budget_s) for r in rows})


def rates_file(width: int) -> Path:
    """Where the rates measured at `width` are kept for this kind of CPU and this torch."""
    try:
        cpu = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        cpu = [platform.processor() or platform.machine()]
    key = hashlib.sha256("\0".join([*cpu, torch.__version__, str(width)]).encode()).hexdigest()[:16]
    home = Path(os.environ.get("RADIXSERVE_HOME", Path.home() / ".cache" / "radixserve"))
    return home / "cpu-precision" / f"{key}.json"


def kept_rates(width: int) -> MatmulRates:
    """The rates measured at `width` on this kind of CPU: read back, or measured now and kept."""
    path = rates_file(width)
    try:
        kept = json.loads(path.read_text())
        return MatmulRates(*({int(rows): float(rate) for rows, rate in kept[kind].items()} for kind in ("bf16", "fp32")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # none yet, or unreadable: measured again
    rates = measure_rates(width)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps({"bf16": rates.bf16, "fp32": rates.fp32}))
        partial.replace(path)  # whole or absent, for a start that reads it at the same time
    except OSError as exc:
        logger.warning("could not keep the measured matmul rates in %s: %s", path, exc)
    return rates


def choose(rates: MatmulRates) -> Precision:
    gemm16, gemm32 = rates.bf16[128], rates.fp32[128]
    if gemm16 >= BF16_GEMM_SHARE * gemm32:
        return Precision(torch.bfloat16, 0, f"bf16 matmul {gemm16:.0f} GFLOP/s vs fp32 {gemm32:.0f}: bf16 throughout")
    faster = [r for r in GEMV_ROWS if rates.bf16[r] > rates.fp32[r]]
    lowp = 0
    for r in GEMV_ROWS:  # the longest run of small row counts where bf16 weights win
        if r not in faster:
            break
        lowp = r
    detail = f"bf16 matmul {gemm16:.0f} GFLOP/s vs fp32 {gemm32:.0f}"
    if not lowp:
        return Precision(torch.float32, 0, f"{detail}, bf16 not faster for few rows either: fp32 throughout")
    return Precision(torch.float32, lowp, f"{detail}: fp32, with bf16 weight copies for products of <= {lowp} "
                                          f"rows (1 row: bf16 {rates.bf16[1]:.0f} vs fp32 {rates.fp32[1]:.0f} GFLOP/s)")


def resolve_precision(name: str, device: torch.device, width: int = 640) -> Precision:
    """The precision for `--dtype name` on `device`; `auto` on the CPU measures (see above)."""
    from runtime.exec.device import resolve_dtype

    if name != "auto":
        return Precision(resolve_dtype(name), 0, f"--dtype {name}")
    if device.type != "cpu":
        return Precision(torch.bfloat16, 0, "bf16 on a GPU")
    rates = kept_rates(width)
    precision = replace(choose(rates), rates=rates)
    logger.info("dtype auto on this CPU: %s", precision.reason)
    return precision
