"""The markdown table of `make bench-paper` (benchmarks/paper.py), written from the run's own report.

    python -m benchmarks.paper_report RUN.json [--peers-from EARLIER.json] [--json OUT.json]

writes a run's table again, with the rows of systems it left out taken from an earlier run (named
as such in the table): radixserve rerun at a new commit beside peers that did not change.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PEERS = [("vllm-cpu", "vLLM CPU"), ("llama.cpp", "llama.cpp")]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _rate(row: dict[str, Any] | None) -> str:
    """A row's req/s, marked where the workload's time limit cut it (its rate: finished over the limit)."""
    return "-" if not row else f"{row['requests_per_s']:.2f}" + (" (cut)" if row.get("cut") else "")


def _hit(row: dict[str, Any] | None) -> str:
    return "-" if row is None or row.get("cache_hit_rate") is None else f"{row['cache_hit_rate']:.0%}"


def markdown(report: dict[str, Any]) -> str:
    """The full page: the table, then each peer's select route, answer agreement and what was left out."""
    systems = {s["name"]: s.get("workloads", {}) for s in report["systems"]}
    lines = [table(report), "", "How each peer answers a select (the workloads mmlu and hellaswag):"]
    lines += [f"- {kind}: {route}" for kind, route in report["select_routes"].items()]
    agreement = _agreement(systems)
    if agreement:
        lines += ["", "Same choice as radixserve (weights differ: ours and llama.cpp serve the GGUF's Q4_K_M codes, "
                  "vLLM the bf16 dequantized copy): " + "; ".join(agreement) + "."]
    for system in report["systems"]:
        for workload, why in (system.get("skipped") or {}).items():
            lines.append(f"\n{system['name']} {workload}: not measured: {why}.")
        for workload, row in (system.get("workloads") or {}).items():
            if row.get("cut"):
                cut = row["cut"]
                lines.append(f"\n{system['name']} {workload}: cut at its {cut['limit_s']:.0f} s limit, "
                             f"{row['requests']} requests finished and {cut['unfinished']} in flight left out "
                             f"(phase {cut['phases_run']} of {cut['phases']}): its rate is the finished requests "
                             "over the limit.")
    failed = [s for s in report["systems"] if "error" in s]
    lines += [f"\n{s['name']}: not measured ({s['error']})" for s in failed]
    return "\n".join(lines)


def table(report: dict[str, Any]) -> str:
    """The header naming the CPU kind and the date, the table, and the jump-forward line (the README's part)."""
    systems = {s["name"]: s.get("workloads", {}) for s in report["systems"]}
    ours = systems.get("radixserve", {})
    names = list(ours) or sorted({w for rows in systems.values() for w in rows})
    lines = [f"CPU: {report['cpu']}; {report['date']}; radixserve at {report.get('revision', 'unknown')}; "
             f"one run (`{report['command'].strip()}`, "
             f"{report['wall_s'] / 60:.1f} min in all, startups included). "
             + ("Every server up at once, idle but the one measured, each workload run on all of them in turn; "
                if report.get("interleaved") else "Every server alone on the machine but for this client; ")
             + f"{report['concurrency']} requests in flight within a phase; greedy; generation "
             "requests produce a fixed token count (ignore_eos) so each peer does the same work."
             + "".join(f" {s['name']}'s rows are from an earlier run ({s['from_run']})." for s in report["systems"]
                       if s.get("from_run")), "",
             "| workload | what | radixserve req/s | " + " | ".join(f"{label} req/s" for _, label in PEERS)
             + " | " + " | ".join(f"vs {label}" for _, label in PEERS)
             + " | latency p50, s (ours / " + " / ".join(label for _, label in PEERS) + ")"
             + " | cache hit (ours / " + " / ".join(label for _, label in PEERS) + ") |",
             "|---|---|---:|" + "---:|" * (2 * len(PEERS)) + "---:|---:|"]
    for name in names:
        mine = ours.get(name)
        theirs = [systems.get(peer, {}).get(name) for peer, _ in PEERS]
        rate = mine["requests_per_s"] if mine else None
        ratios = [f"{rate / t['requests_per_s']:.2f}x" if mine and t else "-" for t in theirs]
        what = (mine or next(t for t in theirs if t))["description"]
        lines.append(f"| {name} | {what} | {_rate(mine)} | "
                     + " | ".join(_rate(t) for t in theirs) + " | "
                     + " | ".join(ratios) + " | "
                     + " / ".join(_fmt(r and r["latency_p50_s"], ".2f") for r in [mine, *theirs]) + " | "
                     + " / ".join(_hit(r) for r in [mine, *theirs]) + " |")
    lines += ["", _json_line(systems)]
    return "\n".join(lines)


def _json_line(systems: dict[str, dict[str, Any]]) -> str:
    on, off = systems.get("radixserve", {}).get("json"), systems.get("radixserve-no-jump-forward", {}).get("json")
    parts = []
    if on and off:
        same = "identical" if on["outputs"] == off["outputs"] else "NOT identical"
        parts.append(f"JSON decoding, radixserve with jump-forward {on['requests_per_s']:.2f} req/s against "
                     f"{off['requests_per_s']:.2f} without (`--disable-jump-forward`): "
                     f"{on['requests_per_s'] / off['requests_per_s']:.2f}x, outputs {same}, "
                     f"{on['completion_tokens']} tokens in all.")
    valid = [f"{name} {rows['json']['valid_json']}/{rows['json']['requests']}"
             for name, rows in systems.items() if rows.get("json")]
    if valid:
        parts.append("Records that parse with every required key: " + ", ".join(valid) + ".")
    return " ".join(parts)


def _agreement(systems: dict[str, dict[str, Any]]) -> list[str]:
    ours = systems.get("radixserve", {})
    out = []
    for peer, label in PEERS:
        for name in ("mmlu", "hellaswag"):
            mine, theirs = ours.get(name), systems.get(peer, {}).get(name)
            if mine and theirs:
                same = sum(a == b for a, b in zip(mine["outputs"], theirs["outputs"]))
                out.append(f"{label} {name} {same}/{len(mine['outputs'])}")
    return out


def merge_peers(report: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
    """Add the earlier run's rows for systems `report` lacks, each marked with the run it came from."""
    ran = {row["name"] for row in report["systems"]}
    report["systems"] += [{**row, "from_run": f"{earlier['date']}, `{earlier['command'].strip()}`"}
                          for row in earlier["systems"] if row["name"] not in ran and "error" not in row]
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--peers-from", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="default: RUN.json itself")
    args = parser.parse_args(argv)
    report = json.loads(args.run.read_text())
    if args.peers_from:
        merge_peers(report, json.loads(args.peers_from.read_text()))
    report["markdown"] = markdown(report)
    out = args.json or args.run
    out.write_text(json.dumps(report, indent=1))
    out.with_suffix(".md").write_text(report["markdown"] + "\n")
    print(report["markdown"])


if __name__ == "__main__":
    main()
