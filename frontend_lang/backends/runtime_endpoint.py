"""The HTTP backend for a radixserve (or SGLang) server: its native /generate route."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx

from frontend_lang.backends.base import Backend, BackendError, Completion, Prompt, common_prefix_len
from frontend_lang.chat_template import Render, jinja_renderer


class RuntimeEndpoint(Backend):
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)
        info = self._call("GET", "/get_model_info")
        self.model_info = info
        self.chat_stop_strings = list(info.get("chat_stop_strings") or [])
        template = info.get("chat_template")
        self._render = jinja_renderer(template, info.get("bos_token") or "", info.get("eos_token") or "") if template else None

    def _call(self, method: str, path: str, body: object = None) -> dict:
        try:
            resp = self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"{path}: {exc}") from exc
        if resp.status_code != 200:
            raise BackendError(f"{path}: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp.json()

    def renderer(self) -> Render | None:
        return self._render

    def generate(self, prompt: Prompt, params: dict[str, object]) -> Completion:
        out = self._call("POST", "/generate", _body(prompt.text, params))
        if isinstance(out, list):  # n > 1: one response per sample
            return Completion(out[0]["text"], dict(out[0].get("meta_info") or {}), [o["text"] for o in out])
        return Completion(out["text"], dict(out.get("meta_info") or {}))

    def flush_cache(self) -> bool:
        return bool(self._call("POST", "/flush_cache").get("success"))

    def server_info(self) -> dict[str, object]:
        return self._call("GET", "/get_server_info")

    def stream(self, prompt: Prompt, params: dict[str, object]) -> Iterator[str]:
        body = {**_body(prompt.text, params), "stream": True}
        sent = 0
        with self.client.stream("POST", "/generate", json=body) as resp:
            if resp.status_code != 200:
                raise BackendError(f"/generate: HTTP {resp.status_code}: {resp.read()[:500]!r}")
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise BackendError(event["error"]["message"])
                text = event["text"]  # cumulative, as SGLang streams it
                yield text[sent:]
                sent = len(text)

    def tokenize(self, text: str) -> list[int]:
        return self._call("POST", "/tokenize", {"text": text})["tokens"]

    def choice_logprobs(self, prompt: Prompt, choices: list[str]) -> list[list[float]]:
        base = self.tokenize(prompt.text)
        batch = [self.tokenize(prompt.text + c) for c in choices]
        starts = [min(common_prefix_len(base, ids), len(ids) - 1) for ids in batch]
        # One batch request: the server computes the shared prefix once and the choices reuse it.
        params = [{"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": s} for s in starts]
        outs = self._call("POST", "/generate", {"input_ids": batch, "sampling_params": params})
        return [[v for v, _, _ in out["meta_info"]["input_token_logprobs"] if v is not None]
                for out in (outs if isinstance(outs, list) else [outs])]

    def unconditional_logprobs(self, choices: list[str]) -> list[list[float]]:
        body = {"input_ids": [self.tokenize(c) for c in choices], "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0}}
        outs = self._call("POST", "/generate", body)
        return [[v or 0.0 for v, _, _ in out["meta_info"]["input_token_logprobs"]]
                for out in (outs if isinstance(outs, list) else [outs])]

    def warm(self, text: str) -> None:
        self._call("POST", "/generate", {"text": text, "sampling_params": {"max_new_tokens": 0}})


REQUEST_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


def _body(text: str, params: dict[str, object]) -> dict[str, object]:
    """A /generate body: the logprob switches are top-level fields, as SGLang has them."""
    body: dict[str, object] = {"text": text}
    body.update({k: params[k] for k in REQUEST_FIELDS if k in params})
    if params.get("lora"):  # a LoRA adapter, by SGLang's field for its name
        body["lora_path"] = params["lora"]
    body["sampling_params"] = {k: v for k, v in params.items() if k not in REQUEST_FIELDS and k != "lora"}
    return body
