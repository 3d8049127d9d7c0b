"""What an engine resolved at build time, in one place: the server's /get_server_info and
/get_model_info, benchmarks and logs read this instead of the engine's parts."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class EngineInfo:
    model_path: str
    device: str  # resolved: "cpu", "cuda:0"
    dtype: str  # resolved: "float32", "bfloat16"
    dtype_choice: str  # why that dtype (runtime/cpu/precision.py measures it for --dtype auto on a CPU)
    quantization: str | None
    attention_backend: str  # resolved: "torch", "triton"
    cuda_graph_batch_sizes: list[int]  # decode batch sizes captured as CUDA graphs (empty: eager)
    overlap_schedule_on: bool
    kv_cache_tokens: int  # KV pool size
    page_size: int
    context_length: int
    vocab_size: int
    cpu_threads: int | None = None  # the CPU threads' ceiling (runtime/cpu/thread_budget.py); None on a GPU
    adapt_cpu_threads: bool = False  # whether fewer are used while other processes hold cores

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
