"""Plots from benchmark JSON files: throughput by workload and system, TTFT, hit rate vs KV size."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _grouped_bars(results: list[dict], key: str, ylabel: str, title: str, out: Path, log: bool = False) -> Path:
    """One group of bars per workload, one bar per system."""
    systems = [s["name"] for s in results[0]["systems"]]
    workloads = [r["workload"] for r in results]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(systems)
    for i, name in enumerate(systems):
        values = [next((s[key] or 0 for s in r["systems"] if s["name"] == name), 0) for r in results]
        ax.bar([w + i * width for w in range(len(workloads))], values, width, label=name)
    ax.set_xticks([w + width * (len(systems) - 1) / 2 for w in range(len(workloads))], workloads)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def throughput_by_workload(results: list[dict], out: Path) -> Path:
    return _grouped_bars(results, "requests_per_s", "requests / s",
                         "Throughput by workload and system (one run, same machine)", out)


def ttft_by_system(results: list[dict], out: Path) -> Path:
    return _grouped_bars(results, "ttft_p50_s", "time to first token, p50 (s)",
                         "Time to first token (lower is better)", out, log=True)


def ttft_cdf(samples: dict[str, list[float]], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in samples.items():
        values = sorted(values)
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=name)
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("share of requests")
    ax.set_title("TTFT CDF, shared-prefix workload")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def hit_rate_vs_kv(points: list[dict], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["kv_cache_tokens"] for p in points], [p["cache_hit_rate"] for p in points], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("KV cache size (tokens)")
    ax.set_ylabel("prefix cache hit rate")
    ax.set_title("Hit rate vs KV cache size (shared-prefix)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def load(paths: list[Path]) -> list[dict]:
    return [json.loads(p.read_text()) for p in paths]
