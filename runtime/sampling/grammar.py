"""Constrained decoding with xgrammar: regex, JSON Schema, EBNF and structural-tag constraints as per-token bitmasks.

xgrammar (the library SGLang and vLLM use) compiles a constraint against the tokenizer's vocabulary
once; compiled grammars are cached by their source. Each request (each sample of an n > 1 request)
gets its own matcher, which says which tokens may come next; the sampler's room applies that as a
bitmask to the logits on their device, and the output room feeds the chosen token back. Accepted
tokens are never taken back (a retracted request keeps its tokens, so its matcher stays right).

JSON is compiled without free whitespace (compact separators, as vLLM's `disable_any_whitespace`):
a small model must not be free to loop on spaces and newlines inside an object.
Compilation happens where a request is submitted (a bad constraint is a ValueError there), never
on the engine loop's thread.
"""

from __future__ import annotations

import json
import re
import threading

import torch

from runtime.sampling.grammar_vocab import tokenizer_info
from runtime.sampling.json_grammar import json_schema_ebnf, repair_json_ebnf

# `response_format: {"type": "json_object"}` asks for an object, not any JSON value.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class Grammars:
    def __init__(self, hf_tokenizer: object, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        if hf_tokenizer is None:
            raise ValueError("constrained decoding needs the model's tokenizer; this model folder has none")
        self._tokenizer, self._stop_token_ids = hf_tokenizer, stop_token_ids
        self.vocab_size = vocab_size
        # One compiler per view of special tokens (runtime/sampling/grammar_vocab.py); the usual one now.
        self._compilers: dict[bool, object] = {}
        self.compiler = self._compiler(skip_special_tokens=True)
        self.batch = xgr.BatchGrammarMatcher(max_threads="auto")  # fills many rows' masks in parallel
        self._lock = threading.Lock()  # compile from any thread, one at a time

    def _compiler(self, skip_special_tokens: bool) -> object:
        if skip_special_tokens not in self._compilers:
            info = tokenizer_info(self._tokenizer, self.vocab_size, self._stop_token_ids, skip_special_tokens)
            self._compilers[skip_special_tokens] = self._xgr.GrammarCompiler(info, max_threads=2, cache_enabled=True)
        return self._compilers[skip_special_tokens]

    def compile(self, kind: str, source: str, skip_special_tokens: bool = True) -> object:
        """A compiled grammar for a constraint; a ValueError naming the field when it is invalid.

        skip_special_tokens: the request's; it decides whether special tokens are text to the grammar."""
        try:
            with self._lock:
                compiler = self._compiler(skip_special_tokens)
                if kind == "regex":
                    return compiler.compile_regex(source)
                if kind == "json_schema":
                    json.loads(source)  # a clear message for what is not JSON at all
                    # xgrammar's schema conversion, with its string rules made strict (runtime/sampling/json_grammar.py)
                    return compiler.compile_grammar(json_schema_ebnf(source, any_whitespace=False, strict_mode=True))
                if kind == "ebnf":
                    return compiler.compile_grammar(source)
                if kind == "structural_tag":
                    json.loads(source)
                    return self._structural_tag(compiler, source)
        except (ValueError, self._xgr.InvalidStructuralTagError) as exc:
            raise ValueError(f"{kind}: {exc}") from exc
        except RuntimeError as exc:  # xgrammar reports parse errors this way, after a source location
            message = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(exc).strip().splitlines()[-1])
            raise ValueError(f"{kind}: invalid: {message}") from exc
        raise ValueError(f"unknown constraint kind {kind!r}")

    def _structural_tag(self, compiler: object, source: str) -> object:
        """Its JSON (tool-call arguments) repaired as a schema's is, where xgrammar prints the grammar
        (tags triggered by text); tags triggered by a token need the vocabulary to build: as they are."""
        try:
            ebnf = repair_json_ebnf(str(self._xgr.Grammar.from_structural_tag(source)))
        except (self._xgr.InvalidStructuralTagError, RuntimeError, ValueError):
            return compiler.compile_structural_tag(source)  # type: ignore[attr-defined]
        return compiler.compile_grammar(ebnf)  # type: ignore[attr-defined]

    def matcher(self, compiled: object) -> object:
        return self._xgr.GrammarMatcher(compiled)

    def fill(self, matchers: list[object | None]) -> torch.Tensor:
        """The host bitmask [len(matchers), words] of every row's allowed tokens (xgrammar's layout: bit
        t % 32 of word t // 32, 1 allowed). Rows without a matcher allow everything."""
        xgr = self._xgr
        bitmask = torch.full(xgr.get_bitmask_shape(len(matchers), self.vocab_size), -1, dtype=xgr.bitmask_dtype,
                             device="cpu")
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if len(rows) == 1:
            matchers[rows[0]].fill_next_token_bitmask(bitmask, rows[0])  # type: ignore[union-attr]
        elif rows:
            self.batch.batch_fill_next_token_bitmask([matchers[i] for i in rows], bitmask, indices=rows)
        return bitmask


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """In place: every token a row's bitmask rules out gets -inf, for the rows named (one copy of
    the bitmask to the logits' device)."""
    if not rows:
        return
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), indices=rows)
