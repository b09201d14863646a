"""Object ids in OpenAI's style: a type prefix and random hex."""

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"
