"""Every option of `respd serve`, read from `RESPD_*` env vars and CLI flags.

`Settings` is one flat pydantic-settings model (so each flag is `--name` and `RESPD_NAME`)
composed of one model per concern; each concern hands its component the settings object
that component takes. Every field becomes a `respd serve --flag` (see `cli.py`), so adding
a field to a concern is the whole job of adding a flag. No two concerns may define the same
name, validators included: the first base's would hide the other's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel
from pydantic_settings import BaseSettings, SettingsConfigDict

from respd.config.engine import EngineConfig
from respd.config.http import HttpConfig
from respd.config.keys import KeysConfig
from respd.config.limits import LimitsConfig
from respd.config.log import LogConfig
from respd.config.media import MediaConfig
from respd.config.models import ModelsConfig
from respd.config.sampling import SamplingConfig
from respd.config.store import StoreConfig
from respd.config.tools import ToolsConfig
from respd.config.upstream import UpstreamConfig
from respd.config.vector_stores import VectorStoresConfig
from respd.config.websocket import WebSocketConfig

if TYPE_CHECKING:
    from respd.service.sealing import Sealer


class Settings(
    HttpConfig,
    KeysConfig,
    LimitsConfig,
    WebSocketConfig,
    EngineConfig,
    ModelsConfig,
    SamplingConfig,
    UpstreamConfig,
    MediaConfig,
    ToolsConfig,
    VectorStoresConfig,
    StoreConfig,
    LogConfig,
    BaseSettings,
):
    """Every option of `respd serve`; each is also the env var `RESPD_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="RESPD_", extra="ignore", title="respd serve")

    @classmethod
    def concerns(cls) -> list[type[BaseModel]]:
        """The models `Settings` is made of, in the order `respd serve --help` lists them."""
        return [base for base in cls.__bases__ if base is not BaseSettings]

    def sealer(self) -> Sealer:
        """Seals client-held state under `--state-key`, else under the key in `--data-dir`."""
        from respd.service.sealing import Sealer  # cryptography: only once it is served

        if self.state_key:
            return Sealer.from_secret(self.state_key)
        return Sealer.from_data_dir(self.data_dir.expanduser())
