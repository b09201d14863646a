"""Read a JSON body into a protocol model, with OpenAI-shaped 400s and a log of unknown keys."""

from __future__ import annotations

import json
import logging
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from respd.api.errors import validation_error
from respd.protocol.errors import InvalidRequest

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


async def parse_body(request: Request, model: type[M]) -> M:
    raw = await request.body()
    try:
        data = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request ({exc}). The body must be "
            "valid JSON.",
            code="invalid_json",
        ) from exc
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    if parsed.model_extra:
        log.info(
            "ignoring unknown field(s) on %s: %s", request.url.path, sorted(parsed.model_extra)
        )
    return parsed
