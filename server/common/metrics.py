"""Prometheus metrics: engine gauges and counters read from `Engine.stats()` at scrape time, and
latency histograms (TTFT, inter-token, end-to-end) observed by the request handlers.

Beside our names, the prefix cache's counters also go out under the names the peers' dashboards
read: vLLM's `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` (counters in tokens: prompt
tokens looked up, and those found cached; labelled model_name and engine as vLLM does) and
SGLang's `sglang:cache_hit_rate` (a gauge, labelled model_name).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime import Engine

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineCollector(Collector):
    def __init__(self, engine: Engine, model_name: str = "") -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.engine.stats()
        yield GaugeMetricFamily("radixserve_num_running_requests", "Requests in the running batch", s["num_running"])
        yield GaugeMetricFamily("radixserve_num_waiting_requests", "Requests waiting to be admitted", s["num_waiting"])
        slots = GaugeMetricFamily("radixserve_kv_slots", "KV cache slots by state", labels=["state"])
        for state in ("free", "cached", "in_use", "total"):
            slots.add_metric([state], s[f"slots_{state}"])
        yield slots
        used = (s["slots_cached"] + s["slots_in_use"]) / s["slots_total"] if s["slots_total"] else 0.0
        yield GaugeMetricFamily("radixserve_kv_usage_ratio", "Share of KV slots not free", used)
        yield GaugeMetricFamily("radixserve_cache_hit_rate", "Cached prompt tokens / prompt tokens", s["cache_hit_rate"])
        yield CounterMetricFamily("radixserve_prompt_tokens", "Prompt tokens received", s["prompt_tokens_total"])
        yield CounterMetricFamily("radixserve_cached_tokens", "Prompt tokens served from the prefix cache",
                                  s["cached_tokens_total"])
        yield CounterMetricFamily("radixserve_generation_tokens", "Tokens generated", s["generated_tokens_total"])
        yield CounterMetricFamily("radixserve_retractions", "Requests preempted for KV room", s["retractions_total"])
        if "narrowed_logit_rows_total" in s:  # constrained rows computed at their allowed tokens only
            yield CounterMetricFamily("radixserve_narrowed_logit_rows", "Output rows computed at a grammar's allowed "
                                      "tokens only (runtime/exec/step_logits.py)", s["narrowed_logit_rows_total"])
        yield from self._drafts(s)
        yield from self._peer_names(s)
        if "tier_lower_tokens" in s:  # host / disk tiers on (runtime/kv/tiers.py)
            yield from self._tiers(s)

    @staticmethod
    def _drafts(s: dict[str, float]) -> Iterator[CounterMetricFamily]:
        """Draft tokens proposed and kept: jump-forward (a grammar's forced continuation) and n-gram."""
        for key, what in (("jump_forward", "grammar-forced (jump-forward)"), ("spec", "prompt-lookup (n-gram)")):
            if f"{key}_draft_tokens_total" in s:
                yield CounterMetricFamily(f"radixserve_{key}_draft_tokens", f"Draft tokens proposed, {what}",
                                          s[f"{key}_draft_tokens_total"])
                yield CounterMetricFamily(f"radixserve_{key}_accepted_tokens", f"Draft tokens the model chose too, {what}",
                                          s[f"{key}_accepted_tokens_total"])

    def _tiers(self, s: dict[str, float]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Per tier: prompt tokens served from it (a lower tier's by promotion), promotions,
        demotions, what each holds."""
        promoted = {tier: s[f"tier_promoted_{tier}_tokens_total"] for tier in ("host", "disk")}
        hits = CounterMetricFamily("radixserve_kv_tier_hit_tokens", "Cached prompt tokens by the tier they came from",
                                   labels=["tier"])
        hits.add_metric(["device"], max(0.0, s["cached_tokens_total"] - sum(promoted.values())))
        promotions = CounterMetricFamily("radixserve_kv_tier_promoted_tokens",
                                         "Tokens of KV copied back into the pool, by the tier they came from",
                                         labels=["tier"])
        for tier, value in promoted.items():
            hits.add_metric([tier], value)
            promotions.add_metric([tier], value)
        yield hits
        yield promotions
        yield CounterMetricFamily("radixserve_kv_tier_demoted_tokens", "Tokens of KV demoted out of the pool",
                                  s["tier_demoted_tokens_total"])
        yield CounterMetricFamily("radixserve_kv_tier_dropped_tokens",
                                  "Tokens of demoted KV a tier let go (out of room, torn or corrupt)",
                                  s["tier_dropped_tokens_total"])
        held = GaugeMetricFamily("radixserve_kv_tier_tokens", "Tokens of KV each tier holds", labels=["tier"])
        held.add_metric(["device"], s["slots_cached"])
        held.add_metric(["host"], s["tier_host_tokens"])
        yield held
        yield GaugeMetricFamily("radixserve_kv_tier_disk_bytes", "Bytes of the disk tier's files", s["tier_disk_bytes"])
        yield CounterMetricFamily("radixserve_kv_tier_disk_writes", "Files the disk tier wrote",
                                  s["tier_disk_writes_total"])
        yield CounterMetricFamily("radixserve_kv_tier_disk_corrupt", "Disk tier files found torn or corrupt (skipped)",
                                  s["tier_disk_corrupt_total"])
        yield CounterMetricFamily("radixserve_kv_tier_disk_prefetched",
                                  "Disk tier files read ahead for queued requests", s["tier_disk_prefetched_total"])

    def _peer_names(self, s: dict[str, float]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The prefix-cache numbers under vLLM's and SGLang's names (their dashboards' queries)."""
        vllm_labels, model = ["model_name", "engine"], [self.model_name, "0"]
        queries = CounterMetricFamily("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.", labels=vllm_labels)
        queries.add_metric(model, s["prompt_tokens_total"])
        yield queries
        hits = CounterMetricFamily("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.", labels=vllm_labels)
        hits.add_metric(model, s["cached_tokens_total"])
        yield hits
        rate = GaugeMetricFamily("sglang:cache_hit_rate", "The prefix cache hit rate.", labels=["model_name"])
        rate.add_metric([self.model_name], s["cache_hit_rate"])
        yield rate


class Metrics:
    def __init__(self, engine: Engine, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, model_name))
        self.ttft = Histogram("radixserve_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("radixserve_inter_token_latency_seconds", "Time between streamed tokens",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("radixserve_e2e_request_latency_seconds", "Request latency, end to end",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
