"""Jump-forward's choices without a model: which characters become probes, which of the
characters a grammar admits the walk goes on with, and how an output's spacing is learnt."""

from __future__ import annotations

from respd.engines.llamacpp.jumpforward import ForcedText, Spacing


def forced_text(single: str = "".join(chr(c) for c in range(32, 127))) -> ForcedText:
    """Probes over a toy vocabulary: each character of `single` is one token (its code),
    every other character two tokens."""

    def tokenize(text: str) -> list[int]:
        return [ord(c) for c in text if c in single] or [1, 2]

    return ForcedText(lambda t: chr(t).encode(), tokenize, n_vocab=256)


def test_probes_are_the_characters_that_are_one_token_of_their_own() -> None:
    ft = forced_text(single='{}":, ab')
    assert sorted(ft._chars) == sorted('{}":, ab')
    assert all(ft._ids[i] == ord(c) for i, c in enumerate(ft._chars))
    # No probes: never drafts (the grammar is not even read, so any object stands in for it).
    assert forced_text(single="").draft(object(), Spacing(), room=8) == []


def test_one_admitted_character_is_taken() -> None:
    ft = forced_text()
    quote = ft._chars.index('"')
    assert ft._choose([quote], Spacing(), "") == quote


def test_a_space_or_one_other_follows_the_habit() -> None:
    ft = forced_text()
    space, colon, quote = ft._chars.index(" "), ft._chars.index(":"), ft._chars.index('"')
    fresh = Spacing()
    # A JSON writer's default: a space after `:` and `,`, none after a key's quote.
    assert ft._choose([space, quote], fresh, ":") == space
    assert ft._choose([space, colon], fresh, '"') == colon
    assert ft._choose([quote, space], fresh, "{") == quote


def test_a_real_choice_stops_the_walk() -> None:
    ft = forced_text()
    a, b, space = ft._chars.index("a"), ft._chars.index("b"), ft._chars.index(" ")
    assert ft._choose([], Spacing(), "") is None
    assert ft._choose([a, b], Spacing(), "") is None  # two non-space characters
    assert ft._choose([a, b, space], Spacing(), ":") is None


def test_spacing_learns_the_latest_habit_per_character() -> None:
    spacing = Spacing()
    assert spacing.spaced(":") and spacing.spaced(",") and not spacing.spaced("{")
    spacing.learn('{ "a":1,')
    assert spacing.spaced("{") and not spacing.spaced(":")
    assert spacing.last == ","
    # Across pieces: the `,` above is followed by the next piece's first character.
    spacing.learn('"b": 2')
    assert not spacing.spaced(",") and spacing.spaced(":")
    assert spacing.last == "2"
    spacing.learn("")
    assert spacing.last == "2"
