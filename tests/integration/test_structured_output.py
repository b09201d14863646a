"""`text.format` json_schema / json_object on `/v1/responses`, through the SDK's helpers."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.sdk_types import strict_response
from tests.support.servers import MODEL_ID


class Pet(BaseModel):
    name: str = Field(max_length=20)
    kind: Literal["cat", "dog", "bird", "fish"]
    legs: int
    vaccinated: bool


PROMPTS = [
    f"Describe a pet {what} as JSON."
    for what in (
        "named Rex",
        "that swims",
        "that sings",
        "named Tom",
        "with three legs",
        "from Paris",
        "that is old",
        "that is tiny",
        "named Luna",
        "that barks",
        "that sleeps all day",
        "named Kiwi",
        "that likes fish",
        "with spots",
        "that is shy",
        "named Max",
        "that is green",
        "that flies",
        "named Bella",
        "that is fast",
    )
]


def test_parse_returns_a_parsed_object_on_20_prompts(client: openai.OpenAI) -> None:
    assert len(set(PROMPTS)) == 20
    for prompt in PROMPTS:
        r = client.responses.parse(
            model=MODEL_ID, input=prompt, text_format=Pet, max_output_tokens=80
        )
        assert r.status == "completed", (prompt, r.output_text)
        assert isinstance(r.output_parsed, Pet), (prompt, r.output_text)
        assert r.text.format.type == "json_schema"  # type: ignore[union-attr]


class Owner(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=18, le=99)


class Review(BaseModel):
    rating: int = Field(ge=1, le=10)
    stars: int = Field(gt=0, lt=6)
    verdict: Literal["buy", "skip"]
    owner: Owner
    nickname: str | None = Field(max_length=20)
    offset: int = Field(ge=-5, le=5)


def test_parse_with_numeric_bounds_nested_models_and_optionals(client: openai.OpenAI) -> None:
    """`Field(ge=, le=, gt=, lt=)` bounds are enforced by the grammar: every sampled answer
    parses and respects them."""
    for seed in range(10):
        r = client.responses.parse(
            model=MODEL_ID,
            input="Review a toaster as JSON.",
            text_format=Review,
            temperature=1.0,
            max_output_tokens=160,
            extra_body={"seed": seed},
        )
        assert r.status == "completed", (seed, r.output_text)
        review = r.output_parsed
        assert isinstance(review, Review), (seed, r.output_text)
        assert 1 <= review.rating <= 10 and 0 < review.stars < 6, review
        assert 18 <= review.owner.age <= 99 and -5 <= review.offset <= 5, review


def test_stream_helper_with_text_format(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL_ID, input=PROMPTS[0], text_format=Pet, max_output_tokens=80
    ) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Pet)


def test_json_object_always_returns_an_object(client: openai.OpenAI) -> None:
    for seed in range(8):
        raw = client.responses.with_raw_response.create(
            model=MODEL_ID,
            input="Give me a JSON object describing a city.",
            text={"format": {"type": "json_object"}},
            max_output_tokens=120,
            extra_body={"seed": seed},
        )
        r = strict_response(json.loads(raw.text))
        # Completed, or closed before max_output_tokens cut it: one object either way.
        assert isinstance(json.loads(r.output_text), dict), r.output_text
        if r.status == "incomplete":
            assert r.incomplete_details and r.incomplete_details.reason == "max_output_tokens"
        assert r.text.format.type == "json_object"  # type: ignore[union-attr]


class Story(BaseModel):
    title: str
    story: str
    tags: list[str]
    words: int = Field(ge=1, le=5000)


def test_an_answer_the_budget_cuts_still_closes(client: openai.OpenAI) -> None:
    """A long answer in a small budget closes its value in the last tokens: `incomplete`
    (reason `max_output_tokens`), and yet it parses and follows the schema — on both APIs."""
    cut = 0
    for seed in range(4):
        r = client.responses.parse(
            model=MODEL_ID,
            input="Write a very long story about a dragon and a knight, as JSON.",
            text_format=Story,
            max_output_tokens=90,
            extra_body={"seed": seed},
        )
        assert isinstance(r.output_parsed, Story), (seed, r.output_text)
        assert r.usage is not None and r.usage.output_tokens <= 90
        if r.status == "incomplete":
            assert r.incomplete_details and r.incomplete_details.reason == "max_output_tokens"
            cut += 1
    assert cut >= 2  # the budget did cut most of them: the closing was what parsed
    chat = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Write a very long story about a dragon, as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "Story", "schema": Story.model_json_schema(), "strict": True},
        },
        max_tokens=90,
        seed=1,
    )
    choice = chat.choices[0]
    Story.model_validate_json(choice.message.content or "")
    assert choice.finish_reason in ("stop", "length")


def test_schema_with_refs_and_arrays(client: openai.OpenAI) -> None:
    class Item(BaseModel):
        label: str = Field(max_length=12)

    class Basket(BaseModel):
        items: list[Item] = Field(max_length=3)
        owner: Pet

    r = client.responses.parse(
        model=MODEL_ID,
        input="Fill a basket as JSON.",
        text_format=Basket,
        max_output_tokens=160,
        temperature=0,
    )
    assert r.status != "completed" or isinstance(r.output_parsed, Basket)


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


@pytest.mark.parametrize(
    ("fmt", "param", "word"),
    [
        (
            {
                "type": "json_schema",
                "name": "x",
                "schema": {"type": "object", "properties": {"n": {"minimum": 0}}},
            },
            "text.format",
            "minimum",
        ),
        (
            {"type": "json_schema", "name": "x", "schema": {"not": {"type": "string"}}},
            "text.format",
            "not",
        ),
        ({"type": "json_schema", "name": "x", "schema": _deep(12)}, "text.format", "deeper"),
        (
            {
                "type": "json_schema",
                "name": "x",
                "schema": {
                    "type": "object",
                    "properties": {
                        f"p{i}": {"type": "string", "description": "d" * 200} for i in range(200)
                    },
                },
            },
            "text.format",
            "larger",
        ),
        (
            {"type": "json_schema", "name": "x", "schema": {"$ref": "https://x/y.json"}},
            "text.format",
            "local",
        ),
        ({"type": "json_schema", "name": "bad name", "schema": {}}, "text.format.name", "name"),
        ({"type": "json_schema", "name": "x"}, "text.format.schema", "schema"),
        ({"type": "grammar"}, "text.format.type", "grammar"),
    ],
)
def test_bad_schemas_are_400_naming_the_problem(
    http: httpx.Client, fmt: dict[str, Any], param: str, word: str
) -> None:
    r = http.post("/v1/responses", json={"model": MODEL_ID, "input": "hi", "text": {"format": fmt}})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert word in err["message"]
