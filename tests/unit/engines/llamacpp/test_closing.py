"""Closing a constrained output before its limit: the token ranking and the replay that
estimates how many tokens close a grammar's value, and the forced text closing spells in its own
tokens, on the embedded model's vocabulary."""

from __future__ import annotations

import ctypes
import functools
import json

import llama_cpp
import pytest

from respd.engines.llamacpp.closing import Closer, ClosingVocab, _preference, grammar_literals
from respd.engines.llamacpp.jumpforward import ForcedText
from respd.engines.llamacpp.sampler import GrammarCheckedSampler
from tests.unit.engines.llamacpp.grammar_oracle import _tokens, _vocab, schema_grammar

BOX = {
    "type": "object",
    "properties": {
        "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "dims": {
            "type": "object",
            "properties": {
                "width": {"type": "integer", "minimum": 1, "maximum": 10},
                "unit": {"enum": ["cm", "in"]},
            },
            "required": ["width", "unit"],
        },
        "count": {"type": "integer", "minimum": 0, "maximum": 5},
    },
    "required": ["label", "dims", "count"],
}


@functools.cache
def closing_vocab() -> ClosingVocab:
    _, vocab = _vocab()
    pieces = []
    buf = (ctypes.c_char * 64)()
    for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, 64, 0, False)
        pieces.append(buf.raw[: max(n, 0)])
    return ClosingVocab.of(pieces, llama_cpp.llama_vocab_eos(vocab))


def tokenize(text: str) -> list[int]:
    return list(_tokens(text)) if text else []


class State:
    """A grammar sampler fed `prefix`, for `Closer.need` to replay from."""

    def __init__(self, grammar: str, prefix: str) -> None:
        _, vocab = _vocab()
        self.grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        for char in prefix:
            for token in _tokens(char):
                llama_cpp.llama_sampler_accept(self.grammar, token)

    def __del__(self) -> None:
        llama_cpp.llama_sampler_free(self.grammar)


def need(grammar: str, prefix: str) -> int | None:
    state = State(grammar, prefix)  # held: its sampler is freed with it
    return Closer(closing_vocab(), grammar, tokenize).need(state.grammar)


def test_a_quote_ranks_first_whitespace_last() -> None:
    ranked = sorted(['"', "]", '"}', " }", '",', ",", ":", "dims", " ", "\n", ""], key=_preference)
    assert ranked[-2:] == ['"', '"}'] or ranked[-2:] == ['"}', '"']
    assert _preference('"') > _preference("]") > _preference(" }") > _preference('",')
    assert _preference('",') > _preference(",") > _preference("dims") > _preference(" ")
    assert _preference(" ") == _preference("\n") == -1 and _preference("") == 0


def test_grammar_literals_are_unescaped() -> None:
    assert grammar_literals(r'root ::= "\"width\"" space ":" "a\\b\n"') == [
        '"width"',
        ":",
        "a\\b\n",
    ]


def test_the_replay_closes_a_string_that_ran_on() -> None:
    grammar = schema_grammar(BOX).text
    inside = need(grammar, '{"label": "a small box with a lid, a window and a door')
    nested = need(grammar, '{"label": null, "dims": {"width": 3, "unit": "cm"}, "count": ')
    done = need(grammar, '{"label": null, "dims": {"width": 3, "unit": "cm"}, "count": 1}')
    assert inside is not None and nested is not None
    # The rest of a label, both keys, the nested object: more than the last digit and brace.
    assert 10 <= inside <= 40 and 1 <= nested <= 3 and done == 0


def test_the_replay_spells_a_key_in_its_own_tokens() -> None:
    """The keys' and enum values' tokens are in the alphabet: "unit" is no four steps."""
    grammar = schema_grammar(BOX).text
    after_width = need(grammar, '{"label": null, "dims": {"width": 3')
    assert after_width is not None and after_width <= 16


def test_what_closes_past_the_cap_is_none() -> None:
    assert need('root ::= "x" "y"{80}', "x") is None
    assert need(schema_grammar({"type": "string", "minLength": 2000}).text, '"') is None


@pytest.mark.parametrize("value", [[], {"a": [1, {"b": "c"}]}, "text"])
def test_any_json_closes_from_inside_nesting(value: object) -> None:
    grammar = schema_grammar({}).text
    text = json.dumps({"x": [value, {"y": "open string"}]})
    prefix = text[: text.index("open") + 3]
    steps = need(grammar, prefix)
    assert steps is not None and steps <= 8


def test_closing_spells_the_forced_text_in_its_own_tokens() -> None:
    """Where the grammar forces the text (the next keys and their punctuation), closing takes
    the text's own tokens with no optional space, not the model's: fewer tokens to the end."""
    grammar = schema_grammar(BOX).text
    _, vocab = _vocab()
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = (ctypes.c_char * 64)()

    def piece(token: int) -> bytes:
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, 64, 0, False)
        return buf.raw[: max(n, 0)]

    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    sampler = GrammarCheckedSampler(chain, vocab, grammar, n_vocab)
    try:
        for token in tokenize('{"label": null'):
            assert sampler.take(token)
        closer = Closer(closing_vocab(), grammar, tokenize, ForcedText(piece, tokenize, n_vocab))
        forced = ',"dims":{"width":'  # then a digit: the model's choice again
        spelt: list[str] = []
        while "".join(spelt) != forced:
            assert forced.startswith("".join(spelt)), spelt
            token, overridden = closer.sample(sampler, None, 0)  # no logits are read
            assert not overridden
            spelt.append(piece(token).decode())
        assert len(spelt) == len(tokenize(forced)) < len(forced) / 2
    finally:
        sampler.close()
        llama_cpp.llama_sampler_free(chain)
