"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

Raised anywhere below the HTTP layer; `api/errors.py` turns them into responses.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error a client should see, with its HTTP status and OpenAI error fields."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        if status_code is not None:
            self.status_code = status_code
        if error_type is not None:
            self.error_type = error_type

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequest(APIError):
    """400: the request is malformed or asks for something we do not do."""


class MissingParameter(InvalidRequest):
    """400: a required parameter is absent (OpenAI's `missing_required_parameter`)."""

    def __init__(self, param: str | None) -> None:
        super().__init__(
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )


class NotFound(APIError):
    status_code = 404


class ContextLengthExceeded(APIError):
    def __init__(self, message: str, *, param: str = "input") -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class Unsupported(InvalidRequest):
    """400 for a field or value this server does not (yet) implement, naming it."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="unsupported_parameter")


class ServerError(APIError):
    status_code = 500
    error_type = "server_error"


class UpstreamFailed(APIError):
    """A remote engine's refusal (its own 4xx, passed through to the client) or failure
    (502 when it failed or could not be reached, 504 when it timed out)."""

    def __init__(self, message: str, status: int) -> None:
        refused = status < 500
        super().__init__(
            message,
            status_code=status,
            code="upstream_refused" if refused else "upstream_error",
            error_type="invalid_request_error" if refused else "server_error",
        )


def model_not_found(model: str) -> NotFound:
    return NotFound(
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )
