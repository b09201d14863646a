"""`metadata`: at most 16 string pairs, keys up to 64 and values up to 512 characters."""

from __future__ import annotations

from respd.protocol.errors import InvalidRequest

METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512


def check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > METADATA_MAX_PAIRS:
        raise InvalidRequest(
            f"Invalid 'metadata': too many properties. Expected at most {METADATA_MAX_PAIRS}, "
            f"but got {len(metadata)}.",
            param="metadata",
            code="object_above_max_properties",
        )
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY:
            raise InvalidRequest(
                f"Invalid 'metadata': key {key[:20]!r}... is longer than {METADATA_MAX_KEY} "
                "characters.",
                param="metadata",
                code="invalid_value",
            )
        if len(value) > METADATA_MAX_VALUE:
            raise InvalidRequest(
                f"Invalid 'metadata': the value of {key!r} is longer than {METADATA_MAX_VALUE} "
                "characters.",
                param="metadata",
                code="invalid_value",
            )
