"""The table and the plot of benchmarks/outside_load.py, written from the run's own report."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(report: dict[str, Any]) -> str:
    lines = [f"CPU: {report['cpu']}; {report['date']}; radixserve at {report.get('revision', 'unknown')}; one run "
             f"(`{report['command'].strip()}`), AIPerf {report['aiperf']}. "
             "AIPerf's shared-prefix profile (4 prefixes of ~384 tokens + ~64 tokens each, 64 output tokens, "
             "streamed /v1/completions), then our client (benchmarks/serving.py) replaying AIPerf's exact prompts "
             "at the same concurrency. Each server alone but for the load tool, on the same machine.", "",
             "| system | concurrency | requests | output tok/s, AIPerf / ours | req/s, AIPerf / ours "
             "| TTFT p50 ms, AIPerf / ours | ITL p50 ms, AIPerf / ours | AIPerf's own CPU s in its wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for system in report["systems"]:
        for point in system.get("points", []):
            a, o = point["aiperf"], point["ours"]
            lines.append(f"| {system['name']} | {point['concurrency']} | {_f(a['requests'], '.0f')} | "
                         f"{_f(a['output_token_throughput'], '.1f')} / {_f(o['output_token_throughput'], '.1f')} | "
                         f"{_f(a['request_throughput'], '.2f')} / {_f(o['request_throughput'], '.2f')} | "
                         f"{_f(a['ttft_p50_ms'], '.0f')} / {_f(o['ttft_p50_ms'], '.0f')} | "
                         f"{_f(a['itl_p50_ms'], '.1f')} / {_f(o['itl_p50_ms'], '.1f')} | "
                         f"{a['aiperf_cpu_s']:.0f} in {a['aiperf_wall_s']:.0f} |")
        if "error" in system:
            lines.append(f"\n{system['name']}: not measured ({system['error']})")
    return "\n".join(lines)


def plot(report: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for index, system in enumerate(report["systems"]):
        points = system.get("points", [])
        if not points:
            continue
        xs = [p["concurrency"] for p in points]
        for tool, style in (("aiperf", "-o"), ("ours", "--s")):  # one colour per system, one line style per tool
            label = f"{system['name']} ({'AIPerf' if tool == 'aiperf' else 'benchmarks/serving.py'})"
            ax.plot(xs, [p[tool]["output_token_throughput"] for p in points], style, color=f"C{index}", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"Shared-prefix load, default model ({report['date'][:10]})", fontsize=10)
    ax.text(0.01, 0.01, report["cpu"], transform=ax.transAxes, fontsize=7, color="gray")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
