"""Tokenization for the engine: prompts and chat templates in, text out, via `transformers`.

Also knows the model's stop tokens (generation_config.json's `eos_token_id` plus the
tokenizer's) and, for chat, its stop strings (generation_config.json's `stop_strings`).
A folder without tokenizer files still serves token ids (`input_ids` in, `token_ids` out);
text in then raises a ValueError saying so, and text out is empty.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

from runtime.loading.transformers_import import skip_hub_kernels_probe

# Families whose checkpoints degenerate without BOS first (Gemma's tokenizer may not add it).
_NEEDS_BOS = ("gemma",)
logger = logging.getLogger(__name__)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json")


class Tokenizer:
    def __init__(self, folder: Path, model_type: str = "") -> None:
        skip_hub_kernels_probe()
        from transformers import AutoTokenizer

        self.hf = None
        if any((folder / name).is_file() for name in _TOKENIZER_FILES):
            try:
                self.hf = AutoTokenizer.from_pretrained(str(folder))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("no usable tokenizer in %s (%s): serving token ids only", folder, exc)
        else:
            # transformers would build an empty tokenizer from the model type; we refuse text instead.
            logger.warning("no tokenizer files in %s: serving token ids only", folder)
        self.bos_token_id: int | None = self.hf.bos_token_id if self.hf is not None else None
        # Decoding runs for every generated token (runtime/text/detokenizer.py): call the Rust tokenizer
        # directly where transformers would add nothing to its result (no clean-up pass): about 6x
        # less host time per token than through transformers' Python wrapper.
        backend = getattr(self.hf, "_tokenizer", None)
        self._fast_decode = (backend.decode if backend is not None and hasattr(backend, "decode")
                             and not getattr(self.hf, "clean_up_tokenization_spaces", False) else None)
        self.needs_bos = any(model_type.startswith(p) for p in _NEEDS_BOS) and self.bos_token_id is not None
        gen = _read_json(folder / "generation_config.json") or _read_json(folder / "config.json")
        eos = gen.get("eos_token_id")
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.hf is not None and self.hf.eos_token_id is not None:
            eos_ids.add(self.hf.eos_token_id)
        self.eos_token_ids: frozenset[int] = frozenset(int(e) for e in eos_ids)
        stops = gen.get("stop_strings") or []
        self.chat_stop_strings: list[str] = [stops] if isinstance(stops, str) else list(stops)

    @property
    def chat_template(self) -> str | None:
        return getattr(self.hf, "chat_template", None) or None

    @property
    def bos_token(self) -> str | None:
        return self.hf.bos_token if self.hf is not None else None

    @property
    def eos_token(self) -> str | None:
        return self.hf.eos_token if self.hf is not None else None

    def _require(self) -> object:
        if self.hf is None:
            raise ValueError("prompt: this model folder has no tokenizer; send token ids (input_ids) instead")
        return self.hf

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def encode(self, text: str) -> list[int]:
        # Text already starting with the BOS string (a rendered chat template) must not get a second one.
        hf = self._require()
        bos = hf.bos_token
        add_special = not (bos and text.startswith(bos))
        return self._with_bos(hf(text, add_special_tokens=add_special).input_ids)

    def apply_chat_template(self, messages: list[dict[str, object]], add_generation_prompt: bool = True,
                            tools: list[dict[str, object]] | None = None,
                            template_kwargs: dict[str, object] | None = None) -> str:
        """The prompt text; `template_kwargs` are extra variables for the template (e.g. Qwen3's
        enable_thinking), as vLLM's and SGLang's `chat_template_kwargs`."""
        if not self.has_chat_template:
            raise ValueError("this model's tokenizer has no chat template; use completions instead")
        extra = dict(template_kwargs or {})
        for reserved in ("messages", "tools", "add_generation_prompt", "tokenize", "conversation", "chat_template"):
            if reserved in extra:
                raise ValueError(f"chat_template_kwargs.{reserved}: set by the request itself, not here")
        try:
            return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                               tools=tools, **extra)
        except Exception as exc:  # jinja raises TemplateError and others for bad messages
            raise ValueError(f"messages: the chat template rejected them: {exc}") from exc

    def encode_chat(self, messages: list[dict[str, object]], add_generation_prompt: bool = True,
                    tools: list[dict[str, object]] | None = None,
                    template_kwargs: dict[str, object] | None = None) -> list[int]:
        return self.encode_rendered(self.apply_chat_template(messages, add_generation_prompt, tools, template_kwargs))

    def encode_rendered(self, text: str) -> list[int]:
        """Token ids of a rendered chat prompt. The template writes BOS itself where the model wants it."""
        return self._with_bos(self._require()(text, add_special_tokens=False).input_ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self.hf is None:
            return ""
        if self._fast_decode is not None:
            return self._fast_decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.needs_bos and (not ids or ids[0] != self.bos_token_id):
            return [self.bos_token_id, *ids]  # type: ignore[list-item]
        return ids


def _read_json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text()) if path.is_file() else {}
