"""Prometheus metrics: engine gauges and counters read from `Engine.stats()` at scrape time, and
latency histograms (TTFT, inter-token, end-to-end) observed by the request handlers."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime import Engine

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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


class Metrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine))
        self.ttft = Histogram("radixserve_time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("radixserve_inter_token_latency_seconds", "Time between streamed tokens",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("radixserve_e2e_request_latency_seconds", "Request latency, end to end",
                             buckets=_LATENCY_BUCKETS, registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
