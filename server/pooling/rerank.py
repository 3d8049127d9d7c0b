"""A decoder reranker's prompt and score: Qwen3-Reranker's by default, any other by the flags.

The reranker reads one prompt per (query, document) and judges it with two next tokens: the score
is P(yes) / (P(yes) + P(no)) at the position after the prompt, i.e. sigmoid(logit_yes - logit_no).
The document comes last, so the template's instruction and query are one prefix for every
document of a request: the radix cache computes it once and the other documents hit it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.text.tokenizer import Tokenizer

# Qwen3-Reranker's own prompt (its model card), with the task line and query before the document.
QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
DEFAULT_TOKENS = "yes,no"


@dataclass(frozen=True)
class Reranker:
    template: str = QWEN3_RERANKER_TEMPLATE
    instruction: str = DEFAULT_INSTRUCTION
    tokens: str = DEFAULT_TOKENS  # "relevant,irrelevant": the two next tokens compared

    def __post_init__(self) -> None:
        try:
            self.template.format(instruction="", query="", document="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"rerank_template: use only {{instruction}}, {{query}} and {{document}} ({exc})") from None
        if self.template.find("{query}") > self.template.find("{document}"):
            raise ValueError("rerank_template: {query} must come before {document}, so documents share its prefix")
        if len(self.tokens.split(",")) != 2:
            raise ValueError(f"rerank_tokens: give two tokens, the relevant one first (e.g. yes,no), got {self.tokens!r}")

    def prompt(self, query: str, document: str, instruction: str | None = None) -> str:
        return self.template.format(instruction=instruction or self.instruction, query=query, document=document)

    def token_ids(self, tokenizer: Tokenizer) -> list[int]:
        """The ids of the two judging tokens; a ValueError if this model does not spell one as one token."""
        ids = []
        for word in self.tokens.split(","):
            found = tokenizer.hf.convert_tokens_to_ids(word) if tokenizer.hf is not None else None
            if found is None or found == getattr(tokenizer.hf, "unk_token_id", None):
                spelled = tokenizer.encode_rendered(word)
                spelled = [t for t in spelled if t != tokenizer.bos_token_id]
                if len(spelled) != 1:
                    raise ValueError(f"rerank_tokens: this model spells {word!r} as {len(spelled)} tokens; "
                                     "choose two single tokens with --rerank-tokens")
                found = spelled[0]
            ids.append(int(found))
        return ids


def relevance(logits: list[float]) -> float:
    """P(relevant) from the two tokens' logits: the softmax over just those two."""
    yes, no = logits
    return 1.0 / (1.0 + math.exp(no - yes)) if no - yes < 700 else 0.0
