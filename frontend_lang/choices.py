"""How `select` (and `gen(choices=...)`) decides among choices from their tokens' logprobs, as SGLang's
`choices_method` does.

- token_length_normalized (the default): the highest mean token logprob.
- greedy_token_selection: compare choices token by token, keeping the ones with the best logprob at
  each position; a shorter choice is padded with its own mean so prefixes compete fairly.
- unconditional_likelihood_normalized: the highest mean token logprob after subtracting what the
  choice's tokens score with no prompt at all (so a choice that is likely anywhere gains nothing).
"""

from __future__ import annotations


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")


def decide(method: str, logprobs: list[list[float]],
           unconditional: list[list[float]] | None = None) -> tuple[int, list[float]]:
    """(index of the chosen choice, each choice's mean token logprob). `unconditional`: each
    choice's token logprobs without the prompt, for unconditional_likelihood_normalized."""
    means = [_mean(v) for v in logprobs]
    if method == "token_length_normalized":
        return max(range(len(means)), key=means.__getitem__), means
    if method == "unconditional_likelihood_normalized":
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs the choices' unconditional logprobs")
        gains = [m - _mean(u) for m, u in zip(means, unconditional)]
        return max(range(len(gains)), key=gains.__getitem__), means
    if method == "greedy_token_selection":
        width = max(len(v) for v in logprobs)
        rows = [v + [m] * (width - len(v)) for v, m in zip(logprobs, means)]
        remaining = list(range(len(rows)))
        for j in range(width):
            best = max(rows[i][j] for i in remaining)
            remaining = [i for i in remaining if rows[i][j] == best]
            if len(remaining) == 1:
                break
        return remaining[0], means
    raise ValueError(f"unknown choices_method {method!r}")
