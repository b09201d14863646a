"""Custom tool formats as patterns: the Lark subset (Codex's apply_patch grammar among it)
and regexes."""

from __future__ import annotations

import re

import pytest

from respd.protocol.errors import InvalidRequest
from respd.service.tools.freeform import LarkRejected, input_pattern, lark_to_regex

APPLY_PATCH = r"""
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch\n", True),
        ("*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch", True),
        ("*** Begin Patch\n*** Delete File: b.py\n*** End Patch\n", True),
        (
            "*** Begin Patch\n*** Update File: c.py\n*** Move to: d.py\n@@ def f():\n-    a\n"
            "+    b\n     c\n*** End of File\n*** End Patch\n",
            True,
        ),
        ("*** Begin Patch\n*** End Patch\n", False),  # a hunk is required
        ("*** Begin Patch\n*** Add File: a.txt\nhello\n*** End Patch\n", False),
        ("*** Begin Patch\n*** Add File: a.txt\n+x\n", False),
        ("--- a/x\n+++ b/x\n", False),
    ],
)
def test_apply_patch_grammar_becomes_its_language(text: str, ok: bool) -> None:
    assert bool(re.fullmatch(lark_to_regex(APPLY_PATCH), text)) is ok


def test_terminals_ranges_repetition_and_optional_brackets() -> None:
    grammar = """
    start: WORD ("," WORD)~1..2 [SUFFIX]
    WORD: "a".."c"+
    SUFFIX: "!" | "?"
    """
    rx = lark_to_regex(grammar.replace('"a".."c"+', '("a".."c")+'))
    assert re.fullmatch(rx, "ab,c!")
    assert re.fullmatch(rx, "a,b,c")
    assert not re.fullmatch(rx, "a")
    assert not re.fullmatch(rx, "a,b,c,a")
    assert not re.fullmatch(rx, "ad,b")


def test_continuation_lines_and_common_imports() -> None:
    grammar = "start: NUMBER\n     | CNAME\n%import common (NUMBER, CNAME)\n"
    rx = lark_to_regex(grammar)
    assert re.fullmatch(rx, "3.5") and re.fullmatch(rx, "x_1") and not re.fullmatch(rx, "1x")


@pytest.mark.parametrize(
    ("grammar", "construct"),
    [
        ('start: a\na: "(" a ")" | "x"', "recursive rule 'a'"),
        ("start: WS\n%import common.WS\n%ignore WS", "'%ignore'"),
        ('start: "x"i', "case-insensitive"),
        ("start: /x/i", "regex flags"),
        ("start: b", "undefined name 'b'"),
        ('a: "x"', "without a 'start' rule"),
        ("start: FOO\n%import other.FOO", "import"),
        ("start: _sep{x}\n_sep{x}: x", "template"),
    ],
)
def test_constructs_outside_the_subset_are_named(grammar: str, construct: str) -> None:
    with pytest.raises(LarkRejected, match=re.escape(construct)):
        lark_to_regex(grammar)


def test_formats_map_to_patterns_or_free_text() -> None:
    assert input_pattern(None, "f") is None
    assert input_pattern({"type": "text"}, "f") is None
    regex = {"type": "grammar", "syntax": "regex", "definition": r"\d{3}-\d{4}"}
    assert input_pattern(regex, "f") == r"^(?:\d{3}-\d{4})$"
    with pytest.raises(InvalidRequest) as exc:
        input_pattern({"type": "grammar", "syntax": "lark", "definition": "start: a"}, "f")
    assert exc.value.param == "f.definition" and "undefined name 'a'" in str(exc.value)
