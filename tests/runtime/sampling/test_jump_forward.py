"""Jump-forward decoding as exact speculation (runtime/sampling/jump_forward.py): a constrained
request's forced continuation is drafted and verified under the grammar mask, so the output is
token for token what decoding without it gives (fp32): JSON schemas, regexes, an EBNF, tool calls
(structural tags) and `select`, greedy and seeded sampling, streamed or not, alone and with n-gram
speculation. The counters move, and every KV slot comes back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import frontend_lang as sgl
from runtime import Engine
from runtime.sampling.jump_forward import JumpForward, draft_matchers, grammar_prefix, mid_text_encoder
from server.common.metrics import Metrics
from server.parsers.tools import PARSERS
from server.parsers.tools.base import ToolSpec
from server.parsers.tools.grammar import structural_tag
from tests.runtime.engine_helpers import assert_slots_balanced
from tests.tiny_byte_fallback import MERGES, PIECES, SPECIALS
from tests.tiny_models import save_tiny_model

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"enum": ["Paris", "London", "the other one"]},
    "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 5},
                                                 "number": {"type": "integer"}}, "required": ["street", "number"]},
}, "required": ["name", "age", "city", "tags", "address"]}
# Keys the byte-level tokenizer spells with merges ("the", "er", "an"): other splits are possible
SPLITS = {"type": "object", "properties": {"then": {"type": "integer", "maximum": 9}, "other": {"type": "boolean"},
                                           "answer": {"enum": ["the cat", "another"]}},
          "required": ["then", "other", "answer"]}
TOOLS = [ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                                  "required": ["city"]}),
         ToolSpec("add", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                          "required": ["a", "b"]})]
HERMES = PARSERS["hermes"]
ONE_TOOL = json.dumps(structural_tag(HERMES(TOOLS[:1]), TOOLS[:1], False, "<tool_call>"))  # a named call
TWO_TOOLS = json.dumps(structural_tag(HERMES(TOOLS), TOOLS, True, "<tool_call>"))  # required, parallel
AUTO_TOOLS = json.dumps(structural_tag(HERMES(TOOLS), TOOLS, False))  # free text until <tool_call>
EBNF = 'root ::= "SELECT " column " FROM fruits WHERE kind = \'" ("apple" | "banana" | "cherry") "\';"\n' \
       'column ::= "name" | "price" | "the_count"'
REGEX = r"(yes|no): [a-z]{3,8}\. the end"
PHONE = r"\(\d{3}\) \d{3}-\d{4}"

GREEDY = {"temperature": 0, "max_new_tokens": 80}
SEEDED = {"temperature": 0.9, "top_p": 0.95, "max_new_tokens": 80, "seed": 11}
CASES = [
    {**GREEDY, "json_schema": json.dumps(PERSON)},
    {**SEEDED, "json_schema": json.dumps(PERSON), "n": 2},
    {**GREEDY, "json_schema": json.dumps(SPLITS)},
    {**GREEDY, "regex": REGEX},
    {**SEEDED, "regex": REGEX},
    {**GREEDY, "regex": PHONE, "return_logprob": True, "top_logprobs_num": 2},
    {**GREEDY, "ebnf": EBNF},
    {**SEEDED, "ebnf": EBNF, "min_p": 0.05},
    {**GREEDY, "structural_tag": ONE_TOOL},
    {**SEEDED, "structural_tag": TWO_TOOLS},
    {**GREEDY, "structural_tag": AUTO_TOOLS, "max_new_tokens": 20},
    {**GREEDY, "structural_tag": ONE_TOOL, "stop": ["arguments"]},  # a stop string inside a forced run
    {**GREEDY, "json_schema": json.dumps(PERSON), "max_new_tokens": 7},  # the limit inside a forced run
    {**GREEDY, "json_schema": json.dumps(SPLITS), "repetition_penalty": 1.3, "frequency_penalty": 0.5},
    {**GREEDY, "max_new_tokens": 10, "ignore_eos": True},  # unconstrained beside them
]


FLAT = [c for c in CASES for _ in range(c.get("n", 1))]  # generate() returns each prompt's n samples in a row


def prompts(n: int) -> list[list[int]]:
    return [[5 + (7 * i) % 200, 40 + i, 9, 77, 3 + i % 5] for i in range(n)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("qwen3", tmp_path_factory.mktemp("jump_forward"))


def _generate(folder: Path, cases: list[dict], **engine_args: object) -> tuple[list, dict]:
    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=2048, **engine_args) as engine:
        outs = engine.generate(input_ids=prompts(len(cases)), sampling_params=cases)
        stats = engine.stats()
        assert_slots_balanced(engine)
    return outs, stats


def _same(got: list, want: list) -> None:
    assert [(o.token_ids, o.text, o.finish_reason, o.error) for o in got] == \
           [(o.token_ids, o.text, o.finish_reason, o.error) for o in want]


@pytest.fixture(scope="module")
def plain(folder: Path) -> list:
    outs, stats = _generate(folder, CASES, disable_jump_forward=True)
    assert "jump_forward_draft_tokens_total" not in stats
    return outs


def test_output_is_the_same_with_jump_forward(folder: Path, plain: list) -> None:
    outs, stats = _generate(folder, CASES)
    _same(outs, plain)
    assert stats["jump_forward_draft_tokens_total"] > 0 and stats["jump_forward_accepted_tokens_total"] > 0
    assert stats["jump_forward_accepted_tokens_total"] <= stats["jump_forward_draft_tokens_total"]
    phone, want = (next(o for o, c in zip(got, FLAT) if c.get("regex") == PHONE) for got in (outs, plain))
    for (lp, tok), (lp0, tok0) in zip(phone.logprobs.output_token_logprobs, want.logprobs.output_token_logprobs):
        assert tok == tok0 and lp == pytest.approx(lp0, abs=1e-4)
    # the constraints held: the keys are the schema's, the tool call the format's
    assert outs[0].text.startswith('{"name": "') and '"age": ' in outs[0].text
    named = next(o for o, c in zip(outs, FLAT) if c.get("structural_tag") == ONE_TOOL)
    assert named.text.startswith('\n{"name": "get_weather", "arguments": {')


def test_fewer_steps_than_tokens_with_jump_forward(folder: Path) -> None:
    case = [{**GREEDY, "structural_tag": ONE_TOOL}]
    (off,), off_stats = _generate(folder, case, disable_jump_forward=True)
    (on,), on_stats = _generate(folder, case)
    assert on.token_ids == off.token_ids
    kept = on_stats["jump_forward_accepted_tokens_total"]
    assert kept >= 10  # `\n{"name": "get_weather", "arguments": {` is forced
    # one request alone: every step gives one token plus the forced tokens it kept
    assert on_stats["steps_total"] + kept == off_stats["steps_total"]


def test_with_ngram_speculation(folder: Path, plain: list) -> None:
    outs, stats = _generate(folder, CASES, speculative_algorithm="ngram", speculative_num_draft_tokens=3)
    _same(outs, plain)
    assert stats["jump_forward_draft_tokens_total"] > 0 and stats["spec_draft_tokens_total"] > 0


def test_with_the_overlap_scheduler(folder: Path, plain: list) -> None:
    """Overlapped (the GPU default), the loop reads a step with constrained requests or drafts
    before it plans the next, so they draft from a token on the host: the same output."""
    outs, stats = _generate(folder, CASES, overlap_schedule="on")
    _same(outs, plain)
    assert stats["jump_forward_accepted_tokens_total"] > 0


def test_a_forced_run_split_otherwise_than_the_model_splits_it(folder: Path) -> None:
    """The draft is the forced text as the tokenizer splits it (`the` `n`); a model that prefers `t`
    rejects it there, and its own tokens are the output, as without jump-forward."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    t = tok.convert_tokens_to_ids("t")
    case = [{**GREEDY, "json_schema": json.dumps(SPLITS), "logit_bias": {t: 40.0}}]
    (off,), _ = _generate(folder, case, disable_jump_forward=True)
    (on,), stats = _generate(folder, case)
    assert on.token_ids == off.token_ids and on.text == off.text
    assert stats["jump_forward_accepted_tokens_total"] < stats["jump_forward_draft_tokens_total"]
    assert tok.encode(on.text, add_special_tokens=False) != on.token_ids  # the model's split is not the tokenizer's
    assert t in on.token_ids and json.loads(on.text)["then"] <= 9


def test_streamed_text_is_the_same(folder: Path, plain: list) -> None:
    picks = [0, 2, 3, 6, 8, 11]  # greedy cases of CASES, and their place in `plain`
    index = {i: sum(c.get("n", 1) for c in CASES[:i]) for i in picks}

    async def collect(engine: Engine, i: int) -> str:
        deltas = [o.delta_text async for o in engine.stream(input_ids=prompts(len(CASES))[i],
                                                             sampling_params=CASES[i])]
        return "".join(deltas)

    async def run_all(engine: Engine) -> list[str]:
        return await asyncio.gather(*(collect(engine, i) for i in picks))

    with Engine(model=str(folder), dtype="float32", kv_cache_tokens=2048) as engine:
        streamed = asyncio.run(run_all(engine))
        stats = engine.stats()
        assert stats["jump_forward_accepted_tokens_total"] > 0
        assert_slots_balanced(engine)
        # /metrics counts them (server/common/metrics.py)
        scraped = dict(line.rsplit(" ", 1) for line in Metrics(engine, "tiny").render().decode().splitlines()
                       if line.startswith(("radixserve_jump_forward", "radixserve_narrowed")))
        assert float(scraped["radixserve_jump_forward_draft_tokens_total"]) == stats["jump_forward_draft_tokens_total"]
        assert float(scraped["radixserve_jump_forward_accepted_tokens_total"]) == \
               stats["jump_forward_accepted_tokens_total"]
        assert float(scraped["radixserve_narrowed_logit_rows_total"]) == stats["narrowed_logit_rows_total"] > 0
    assert streamed == [plain[index[i]].text for i in picks]


def test_select_and_gen_in_a_program(folder: Path) -> None:
    @sgl.function
    def pick(s):  # noqa: ANN001, ANN202
        s += "Fruit: " + sgl.select("fruit", choices=["apple", "banana", "the cherry"])
        s += "\nVerdict: " + sgl.gen("verdict", regex=REGEX, max_tokens=30, temperature=0)
        s += "\nData: " + sgl.gen("data", json_schema=json.dumps(SPLITS), max_tokens=40, temperature=0)
        s += "\nChoice: " + sgl.gen("choice", choices=["yes", "no"])

    results = []
    for off in (True, False):
        with Engine(model=str(folder), dtype="float32", kv_cache_tokens=1024, disable_jump_forward=off) as engine:
            state = pick.run(backend=engine)
            results.append({k: state[k] for k in ("fruit", "verdict", "data", "choice")})
            if not off:
                assert engine.stats()["jump_forward_accepted_tokens_total"] > 0
    assert results[0] == results[1]


def test_the_helpers_leave_the_matcher_as_it_was(folder: Path) -> None:
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from runtime.sampling.grammar import Grammars

    tok = AutoTokenizer.from_pretrained(str(folder))
    grammars = Grammars(tok, len(tok), [tok.eos_token_id])
    matcher = grammars.matcher(grammars.compile("json_schema", json.dumps(SPLITS)))
    jump = JumpForward.for_tokenizer(tok)
    draft = jump.propose(matcher, 8)
    assert tok.decode(draft) == '{"then": '[: len(tok.decode(draft))] and len(draft) >= 3
    assert matcher.find_jump_forward_string() == '{"then": '  # nothing was accepted
    assert jump.propose(matcher, 2) == draft[:2]
    assert grammar_prefix(matcher, draft + [tok.convert_tokens_to_ids("x")]) == len(draft)
    # row i's matcher has accepted draft[:i]: its mask allows draft[i]
    rows = draft_matchers(matcher, draft)
    assert len(rows) == len(draft) + 1 and all(r is not None for r in rows)
    bitmask = torch.full(xgr.get_bitmask_shape(len(rows), grammars.vocab_size), -1, dtype=torch.int32)
    for i, row in enumerate(rows):
        row.fill_next_token_bitmask(bitmask, i)
    allowed = [[t for t in range(grammars.vocab_size) if bitmask[i, t // 32] >> (t % 32) & 1] for i in range(len(rows))]
    assert all(draft[i] in allowed[i] for i in range(len(draft)))
    assert allowed[0] != allowed[1]
    assert matcher.find_jump_forward_string() == '{"then": '
    # a token the grammar refuses: no masks past it
    bad = draft_matchers(matcher, [draft[0], tok.convert_tokens_to_ids("x"), draft[1]])
    assert bad[0] is not None and bad[1] is not None and bad[2] is None and bad[3] is None


def save_dummy_prefix_tokenizer(folder: Path) -> object:
    """tests/tiny_byte_fallback.py's tokenizer with Llama 2's dummy prefix: every encoding starts with `▁`."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"<0x{byte:02X}>": 3 + byte for byte in range(256)})
    for piece in PIECES + [a + b for a, b in MERGES]:
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES, byte_fallback=True, unk_token=None))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.save_pretrained(str(folder))
    return fast


def test_a_tokenizer_with_a_dummy_prefix(tmp_path: Path) -> None:
    """Llama 2 / Mistral / Phi-3 tokenizers spell `{` at the start of an encoding as `▁` `{`: the
    forced text is encoded as mid-output text, so it is drafted and kept there too."""
    folder = save_tiny_model("llama", tmp_path)
    hf = save_dummy_prefix_tokenizer(folder)
    assert hf.convert_ids_to_tokens(hf.encode("{", add_special_tokens=False))[0] == "\u2581"
    assert hf.convert_ids_to_tokens(mid_text_encoder(hf)('{"the": ')) == ["<0x7B>", "<0x22>", "the", "<0x22>",
                                                                          "<0x3A>", "\u2581"]
    cases = [{**GREEDY, "json_schema": json.dumps(SPLITS)}, {**SEEDED, "regex": REGEX}]
    off, _ = _generate(folder, cases, disable_jump_forward=True)
    on, stats = _generate(folder, cases)
    _same(on, off)
    assert stats["jump_forward_accepted_tokens_total"] >= 10


def test_a_forced_run_that_starts_inside_a_character(folder: Path) -> None:
    """A regex of multi-byte characters: where the output so far ends inside one, the forced
    continuation is bytes that are no text (xgrammar raised UnicodeDecodeError, which stopped the
    engine loop; found by the schema fuzzing test). Now no draft there, the same output as without
    jump-forward, and the engine serves on."""
    cases = [{"max_new_tokens": 20, "regex": "\u00cbR\u0090\u00b7\U000cdfea\u00cbR", "temperature": 1.0, "seed": s}
             for s in range(3)]
    on, _ = _generate(folder, cases)
    off, _ = _generate(folder, cases, disable_jump_forward=True)
    _same(on, off)
    assert all(o.text == "\u00cbR\u0090\u00b7\U000cdfea\u00cbR" for o in on)
