"""Token logprobs on the wire, and which of them belong to the text a client sees.

The engine reports one `TokenLogprob` per generated token (see `engines/logprobs.py` for
what the numbers mean). Between the engine and the client, text may be filtered: a
tool-call parser drops markers and call JSON, stop sequences cut the tail. Logprobs then
follow the text: a token's entry is given with the message text exactly when the token's
whole text reaches the message; a token only partly in it (one that straddles a call
marker or a stop string) is left out, so the joined `bytes` of the entries are the message
text except at such seams.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from respd.engines.base import TokenLogprob
from respd.protocol.errors import InvalidRequest

MAX_TOP_LOGPROBS = 20


def check_top_logprobs(value: int | None) -> None:
    """`top_logprobs` is 0-20 on both APIs (OpenAI's wording and codes)."""
    if value is None:
        return
    if value > MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            "Invalid 'top_logprobs': integer above maximum value. Expected a value <= "
            f"{MAX_TOP_LOGPROBS}, but got {value} instead.",
            param="top_logprobs",
            code="integer_above_max_value",
        )
    if value < 0:
        raise InvalidRequest(
            "Invalid 'top_logprobs': integer below minimum value. Expected a value >= 0, "
            f"but got {value} instead.",
            param="top_logprobs",
            code="integer_below_min_value",
        )


def logprob_json(lp: TokenLogprob) -> dict[str, Any]:
    """The wire shape both APIs share: Responses' `output_text.logprobs[]` and Chat's
    `logprobs.content[]` are `{token, bytes, logprob, top_logprobs: [{token, bytes, logprob}]}`."""
    return {
        "token": lp.token,
        "bytes": lp.bytes,
        "logprob": lp.logprob,
        "top_logprobs": [
            {"token": t.token, "bytes": t.bytes, "logprob": t.logprob} for t in lp.top
        ],
    }


@dataclass
class _Unit:
    start: int
    end: int
    logprobs: list[TokenLogprob]


class LogprobAligner:
    """Maps released text back to the tokens that produced it.

    `feed` each engine chunk in order (its text and its logprobs); a chunk with no text yet
    (an incomplete UTF-8 character) joins the next chunk's text. `take(start, end)` is
    called for each run of text released downstream, in increasing order, as offsets into
    the fed text; it returns the logprobs of the tokens whose text lies wholly within the
    released text, each once.
    """

    def __init__(self) -> None:
        self._units: deque[_Unit] = deque()
        self._fed = 0
        self._waiting: list[TokenLogprob] = []  # tokens whose text has not appeared yet
        self._run_start = 0  # the contiguous run of released text that `take` extends
        self._run_end = 0

    def feed(self, text: str, logprobs: list[TokenLogprob]) -> None:
        if not text:
            self._waiting += logprobs
            return
        end = self._fed + len(text)
        self._units.append(_Unit(self._fed, end, self._waiting + logprobs))
        self._waiting = []
        self._fed = end

    def take(self, start: int, end: int) -> list[TokenLogprob]:
        if start < 0:  # a stage that cannot say where its text came from
            return []
        if start != self._run_end:
            self._run_start = start
        self._run_end = end
        out: list[TokenLogprob] = []
        while self._units and self._units[0].end <= end:
            unit = self._units.popleft()
            if unit.start >= self._run_start:
                out += unit.logprobs
        return out
