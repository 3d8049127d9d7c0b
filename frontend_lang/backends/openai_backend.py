"""The backend for any OpenAI-compatible server (through the official `openai` client).

Role-based programs use chat completions with their messages; plain-text programs use
completions. `select` needs prompt logprobs, which the OpenAI API does not give.
"""

from __future__ import annotations

from collections.abc import Iterator

from frontend_lang.backends.base import Backend, BackendError, Completion, Prompt
from frontend_lang.chat_template import Render

_OPENAI_FIELDS = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "stop": "stop",
                  "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty", "seed": "seed"}
_EXTRA_NAMES = {"min_new_tokens": "min_tokens"}
_NOT_SENT = {"return_text_in_logprobs", "lora"}  # /generate's logprob formatting; the adapter is the model


class OpenAI(Backend):
    def __init__(self, base_url: str | None = None, model: str = "default", api_key: str | None = None) -> None:
        import openai

        self.client = openai.OpenAI(base_url=base_url, api_key=api_key or "none")
        self.model = model

    def renderer(self) -> Render | None:
        return None  # the server applies the chat template to our messages

    def _params(self, params: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
        known = {_OPENAI_FIELDS[k]: v for k, v in params.items() if k in _OPENAI_FIELDS}
        # Extensions go in the body by vLLM's / SGLang's names (min_tokens is theirs for min_new_tokens).
        extra = {_EXTRA_NAMES.get(k, k): v for k, v in params.items()
                 if k not in _OPENAI_FIELDS and k not in _NOT_SENT}
        return known, extra

    def generate(self, prompt: Prompt, params: dict[str, object]) -> Completion:
        return Completion("".join(self.stream(prompt, params, stream=False)))

    def stream(self, prompt: Prompt, params: dict[str, object], stream: bool = True) -> Iterator[str]:
        import openai

        known, extra = self._params(params)
        model = params.get("lora") or self.model  # a LoRA adapter is chosen by its name as the model (vLLM's way)
        try:
            if prompt.in_assistant and prompt.messages:
                resp = self.client.chat.completions.create(model=model, messages=prompt.messages,
                                                           stream=stream, extra_body=extra, **known)
                if not stream:
                    yield resp.choices[0].message.content or ""
                    return
                for chunk in resp:
                    if chunk.choices:
                        yield chunk.choices[0].delta.content or ""
                return
            resp = self.client.completions.create(model=model, prompt=prompt.text, stream=stream,
                                                  extra_body=extra, **known)
            if not stream:
                yield resp.choices[0].text
                return
            for chunk in resp:
                if chunk.choices:
                    yield chunk.choices[0].text
        except openai.OpenAIError as exc:
            raise BackendError(f"OpenAI backend: {exc}") from exc

    def choice_logprobs(self, prompt: Prompt, choices: list[str]) -> list[list[float]]:
        raise BackendError("select() and gen(choices=...) need prompt logprobs, which the OpenAI API does not "
                           "return; use the Engine or RuntimeEndpoint backend")
