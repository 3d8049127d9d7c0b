"""lm-evaluation-harness as a real client (issue #41): a multiple-choice task of our own
(data/mc_facts.jsonl, 60 questions, in the harness's local-dataset task format) scored by its
`local-completions` model against `python -m server` (what it sends: token-id prompts, `echo`,
`logprobs: 1`, `max_tokens: 1`) and by its Hugging Face backend on the same converted model, both
fp32: the same accuracy, and every choice's loglikelihood within 1e-3.

It runs the server twice, with the prefix cache on and off, and prints the harness's wall time
for each (`pytest -s` shows them). Slow: it converts the default model once and runs it three
times on the CPU. Needs the `eval` extra (`make test-all` installs it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.server.harness import server_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # three runs of 240 scorings: ~10 min on 2 cores

DATA = Path(__file__).parent / "data" / "mc_facts.jsonl"
TASK = "radixserve_mc_facts"
SERVED = "gemma-3-270m"


def _task_dir(tmp: Path) -> Path:
    """The harness's local-dataset task: a YAML naming our JSONL file."""
    (tmp / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {DATA}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: question\n"
        "doc_to_choice: choices\n"
        "doc_to_target: answer\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n")
    return tmp


def _evaluate(model: str, model_args: dict, tasks: Path) -> tuple[dict, float]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    start = time.perf_counter()
    results = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[TASK],
                                      task_manager=TaskManager(include_path=str(tasks)), log_samples=True,
                                      batch_size=1, random_seed=0)
    return results, time.perf_counter() - start


def _loglikelihoods(results: dict) -> dict[int, list[float]]:
    return {s["doc_id"]: [r[0] for r in s["filtered_resps"]] for s in results["samples"][TASK]}


def test_lm_eval_local_completions_matches_its_hf_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lm_eval", reason="the eval extra (pip install -e '.[eval]'; make test-all installs it)")
    from runtime.loading.default_model import ensure_default_model

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "1")  # the task and the model are local: nothing may be fetched
    folder = ensure_default_model(progress=False)
    tasks = _task_dir(tmp_path)
    served: dict[str, tuple[dict, float]] = {}
    for label, flags in (("cache on", []), ("cache off", ["--disable-radix-cache"])):
        args = ["--model", str(folder), "--dtype", "float32", "--quantization", "none", "--served-model-name",
                SERVED, *flags]
        with server_process(*args, log=tmp_path / f"server-{label.replace(' ', '-')}.log", timeout=600) as url:
            served[label] = _evaluate("local-completions", {
                "model": SERVED, "base_url": f"{url}/v1/completions", "tokenizer": str(folder),
                "tokenizer_backend": "huggingface", "tokenized_requests": True, "add_bos_token": True,
                "num_concurrent": 1, "max_retries": 1}, tasks)
    hf, hf_wall = _evaluate("hf", {"pretrained": str(folder), "dtype": "float32", "device": "cpu",
                                   "add_bos_token": True}, tasks)

    hf_acc = hf["results"][TASK]["acc,none"]
    expected = _loglikelihoods(hf)
    assert len(expected) == 60
    for label, (results, wall) in served.items():
        assert results["results"][TASK]["acc,none"] == hf_acc, label
        got = _loglikelihoods(results)
        assert got.keys() == expected.keys()
        worst = max(abs(a - b) for d in expected for a, b in zip(got[d], expected[d], strict=True))
        assert worst < 1e-3, f"{label}: a loglikelihood differs from transformers' by {worst}"
        print(f"\nlm-eval {TASK}: local-completions, {label}: acc {results['results'][TASK]['acc,none']:.4f}, "
              f"wall {wall:.1f} s, largest loglikelihood difference from HF {worst:.2e}")
    print(f"lm-eval {TASK}: hf backend: acc {hf_acc:.4f}, wall {hf_wall:.1f} s")
