"""State handed to a client to give back later, sealed: reasoning carried across
`store: false` turns (`encrypted_content` on reasoning items) and compaction items.

AES-256-GCM under a server key, with the kind of state as associated data, so a blob is
opaque to the client, cannot be altered (a tampered blob fails to open: a 400), and cannot
be replayed as another kind. Any replica given the same key (`--state-key`) opens what
another sealed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_VERSION = b"\x01"
_NONCE = 12
KEY_FILE = "state.key"


class Unsealable(ValueError):
    """A blob this server did not seal with its key, or one altered since."""


class Sealer:
    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("a sealing key is 32 bytes")
        self._aead = AESGCM(key)

    @classmethod
    def from_secret(cls, secret: str) -> Sealer:
        """Any secret string (a passphrase, a hex key) stretched to a key."""
        return cls(hashlib.sha256(b"respd state key\x00" + secret.encode()).digest())

    @classmethod
    def random(cls) -> Sealer:
        """A key for this process only: what it seals, no other process opens."""
        return cls(secrets.token_bytes(32))

    @classmethod
    def from_data_dir(cls, data_dir: Path) -> Sealer:
        """The key kept in `data_dir` (made on first use, readable by its owner only)."""
        path = data_dir / KEY_FILE
        if not path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        return cls.from_secret(path.read_text().strip())

    def seal(self, kind: str, payload: dict[str, Any]) -> str:
        nonce = secrets.token_bytes(_NONCE)
        data = json.dumps(payload, separators=(",", ":")).encode()
        blob = _VERSION + nonce + self._aead.encrypt(nonce, data, kind.encode())
        return base64.urlsafe_b64encode(blob).decode().rstrip("=")

    def open(self, kind: str, token: str) -> dict[str, Any]:
        try:
            blob = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (ValueError, TypeError) as exc:
            raise Unsealable("not a sealed blob") from exc
        if len(blob) <= 1 + _NONCE or blob[:1] != _VERSION:
            raise Unsealable("not a sealed blob")
        nonce, sealed = blob[1 : 1 + _NONCE], blob[1 + _NONCE :]
        try:
            data = self._aead.decrypt(nonce, sealed, kind.encode())
        except InvalidTag as exc:
            raise Unsealable("sealed by another key, or altered") from exc
        payload = json.loads(data)
        if not isinstance(payload, dict):
            raise Unsealable("not a sealed object")
        return payload
