"""The README's and docs/benchmarks.md's results tables, written from the benchmarks' own JSON reports.

Each table sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->` and is only ever written
here, from what a benchmark measured (its report names the CPU kind and the date): a benchmark
calls `write_section` at the end of its run, and `python -m benchmarks.results_page` writes them
all again from benchmarks/results/*.json (after a results file is updated by hand-picked rerun,
say). Nothing here measures anything.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/x.py`: import `benchmarks` as -m would
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs" / "benchmarks.md"


def source_revision() -> str:
    """The radixserve code a run measured: the commit, and whether the engine's code had uncommitted
    changes (a shared checkout may). An export without .git carries its commit in a COMMIT file."""
    import subprocess

    if (ROOT / "COMMIT").exists():
        return (ROOT / "COMMIT").read_text().strip()[:10]
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=10", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "radix", "kernels", "runtime", "server"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted engine changes" if dirty else "")


def write_section(path: Path, name: str, text: str) -> bool:
    """Replace what stands between the markers NAME in `path`; False (nothing written) without them."""
    if not path.exists():
        return False
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    page = path.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), flags=re.DOTALL)
    if not pattern.search(page):
        return False
    path.write_text(pattern.sub(lambda _: f"{begin}\n{text.strip()}\n{end}", page, count=1))
    return True


def peers_table(report: dict) -> str:
    """bench-peers' own table (benchmarks/peers.py's markdown) for the systems a reader compares first."""
    from benchmarks import peers

    keep = {"radixserve", "radixserve-int4", "radixserve-ngram", "vllm-cpu-bf16", "llama.cpp"}
    shown = {**report, "systems": [s for s in report["systems"] if s["name"] in keep]}
    return peers.markdown(shown)


def main() -> None:
    from benchmarks import outside_load_report, paper_report

    written = []
    if (RESULTS / "peers.json").exists():
        report = json.loads((RESULTS / "peers.json").read_text())
        written.append(write_section(README, "bench-peers", peers_table(report)))
    if (RESULTS / "paper.json").exists():
        report = json.loads((RESULTS / "paper.json").read_text())
        written.append(write_section(README, "bench-paper", paper_report.table(report)))
        written.append(write_section(DOCS, "bench-paper", paper_report.markdown(report)))
    if (RESULTS / "outside-load.json").exists():
        report = json.loads((RESULTS / "outside-load.json").read_text())
        written.append(write_section(README, "outside-load", outside_load_report.markdown(report)))
        written.append(write_section(DOCS, "outside-load", outside_load_report.markdown(report)))
    print(f"{sum(written)} of {len(written)} sections written")


if __name__ == "__main__":
    main()
