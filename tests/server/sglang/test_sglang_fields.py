"""/generate with the bodies SGLang's client and router send (copied from sglang 0.5.23's
RuntimeEndpoint and GenerateReqInput), over real HTTP: every SGLang field name is accepted, the
ones that change the answer either work or are refused by name, and the response has SGLang's shape.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.harness import RunningServer

# What sglang.RuntimeEndpoint.generate sends for `sgl.gen("x", max_tokens=8)` under run(temperature=0):
# SglSamplingParams.to_srt_kwargs() plus the two global_config switches, tuples serialised as lists.
CLIENT_SAMPLING = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 8,
                   "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [],
                   "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
                   "presence_penalty": 0.0, "ignore_eos": False, "regex": None, "json_schema": None}


def _post(server: RunningServer, body: object) -> httpx.Response:
    return httpx.post(server.url + "/generate", json=body, timeout=60)


def test_the_body_sglangs_client_sends_for_a_gen(server: RunningServer) -> None:
    resp = _post(server, {"text": "Q: hi\nA:", "sampling_params": CLIENT_SAMPLING})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    meta = out["meta_info"]
    assert {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason"} <= set(meta)
    assert meta["finish_reason"]["type"] in ("length", "stop") and len(out["output_ids"]) == meta["completion_tokens"]


def test_the_bodies_sglangs_client_sends_for_a_select(server: RunningServer) -> None:
    prefix = "The best tool is a "
    first = _post(server, {"text": prefix, "sampling_params": {"max_new_tokens": 0}}).json()
    start = max(first["meta_info"]["prompt_tokens"] - 2, 0)
    body = {"text": [prefix + c for c in ("hammer", "saw")], "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start}
    outs = _post(server, body).json()
    assert len(outs) == 2
    for out in outs:
        logprobs = out["meta_info"]["input_token_logprobs"]
        assert all(len(entry) == 3 and isinstance(entry[2], str) for entry in logprobs)  # [logprob, id, text]
        assert out["meta_info"]["output_token_logprobs"] == []
    # SGLang's unconditional scoring sends the choices' token ids, and reads texts only when asked.
    ids = [[entry[1] for entry in out["meta_info"]["input_token_logprobs"]] for out in outs]
    plain = _post(server, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True}).json()
    assert plain[0]["meta_info"]["input_token_logprobs"] == []  # logprob_start_len -1: none of the prompt
    scored = _post(server, {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
                            "logprob_start_len": 0}).json()
    entries = scored[0]["meta_info"]["input_token_logprobs"]
    assert entries[0][0] is None and [e[1] for e in entries] == ids[0]
    assert [e[2] for e in entries] == [None] * len(ids[0])  # texts only with return_text_in_logprobs


def test_every_sglang_sampling_param_is_accepted(server: RunningServer) -> None:
    sampling = {**CLIENT_SAMPLING, "repetition_penalty": 1.0, "beam_width": None, "ebnf": None, "structural_tag": None,
                "no_stop_trim": False, "stream_interval": 4, "logit_bias": None, "sampling_seed": 3,
                "custom_params": None, "watermark": None, "max_new_tokens": None, "temperature": 0.7}
    resp = _post(server, {"text": "hello", "sampling_params": sampling})
    assert resp.status_code == 200, resp.text
    # max_new_tokens null: until the context is full (the 512-token tiny model stops by length or EOS)
    assert resp.json()["meta_info"]["completion_tokens"] > 8


def test_request_fields_sglang_sends_are_accepted(server: RunningServer) -> None:
    body = {"text": ["a b", "c d"], "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 3}],
            "rid": "batch", "return_logprob": [True, False], "logprob_start_len": [-1, -1], "top_logprobs_num": [2, 0],
            "session_params": None, "session_id": "s1", "lora_path": None, "image_data": None, "log_metrics": False,
            "no_logs": True, "custom_labels": {"team": "x"}, "routing_key": "k", "priority": 1, "extra_key": "ns",
            "return_hidden_states": False, "stream": False, "modalities": None, "model": "tiny"}
    resp = _post(server, body)
    assert resp.status_code == 200, resp.text
    first, second = resp.json()
    assert [first["meta_info"]["id"], second["meta_info"]["id"]] == ["batch_0", "batch_1"]
    assert len(first["meta_info"]["output_top_logprobs"][0]) == 2 and "output_token_logprobs" not in second["meta_info"]


@pytest.mark.parametrize("field,value", [("image_data", "a.png"), ("lora_path", "adapter"),
                                         ("session_params", {"id": "s"}), ("return_hidden_states", True),
                                         ("custom_logit_processor", "x")])
def test_fields_that_would_change_the_answer_are_refused_by_name(server: RunningServer, field: str,
                                                                 value: object) -> None:
    resp = _post(server, {"text": "x", field: value})
    assert resp.status_code == 400 and field in resp.json()["error"]["message"]


@pytest.mark.parametrize("sampling,name", [({"beam_width": 4}, "beam_width"), ({"watermark": {"k": 1}}, "watermark"),
                                           ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens"),
                                           ({"stop_regex": "("}, "stop_regex"), ({"logit_bias": {"99999": 1}}, "logit_bias")])
def test_bad_or_unsupported_sampling_params_are_400s(server: RunningServer, sampling: dict, name: str) -> None:
    resp = _post(server, {"text": "x", "sampling_params": sampling})
    assert resp.status_code == 400 and name in resp.json()["error"]["message"], resp.text
    assert _post(server, {"text": "ok", "sampling_params": {"max_new_tokens": 1}}).status_code == 200


def test_stream_as_sglangs_client_reads_it(server: RunningServer) -> None:
    body = {"text": "hello there", "sampling_params": {**CLIENT_SAMPLING, "max_new_tokens": 6}, "stream": True}
    texts, pos, pieces = [], 0, []
    with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:"):
                if line == "data: [DONE]":
                    break
                data = json.loads(line[5:].strip("\n"))
                texts.append(data["text"])
                pieces.append(data["text"][pos:])  # the text so far, as SGLang streams it
                pos += len(pieces[-1])
    full = _post(server, {"text": "hello there", "sampling_params": {**CLIENT_SAMPLING, "max_new_tokens": 6}}).json()
    assert "".join(pieces) == texts[-1] == full["text"]


def test_health_generate_and_model_info(server: RunningServer) -> None:
    resp = httpx.get(server.url + "/health_generate", timeout=60)
    assert resp.status_code == 200 and resp.json()["status"] == "ok"
    info = httpx.get(server.url + "/get_model_info").json()
    assert {"model_path", "tokenizer_path", "is_generation", "weight_version"} <= set(info)


def test_openai_routes_take_min_tokens(server: RunningServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    free = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0)
    stop = free.choices[0].text[1:3]
    held = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0, stop=[stop],
                                     extra_body={"min_tokens": 6})
    assert held.choices[0].text == free.choices[0].text and held.usage.completion_tokens == 6


def _sglang_fields(relative: str, class_name: str) -> set[str]:
    """The annotated fields of one of SGLang's classes, read from its installed source (not imported)."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed (make test installs it)")
    tree = ast.parse((Path(spec.submodule_search_locations[0]) / relative).read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_every_field_sglang_defines_has_a_place() -> None:
    from runtime import SamplingParams
    from server.sglang import compat
    from server.sglang.protocol import GenerateRequest

    ours = set(SamplingParams.__dataclass_fields__)
    sampling = _sglang_fields("srt/sampling/sampling_params.py", "SamplingParams")
    placed = ours | compat.SAMPLING_HINTS | set(compat.SAMPLING_REFUSED) | set(compat.SAMPLING_ALIASES)
    assert sampling - placed == set()
    request = _sglang_fields("srt/managers/io_struct.py", "GenerateReqInput")
    placed = set(GenerateRequest.__struct_fields__) | compat.REQUEST_HINTS | set(compat.REQUEST_REFUSED)
    assert request - placed == set()
