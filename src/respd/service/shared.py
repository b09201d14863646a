"""The collaborators every service shares, built once per app and handed to each: the
models, the store, the media resolver (and its cache), the sealer, the runs in flight (and
how far each may run), the input limits and each identity's quotas."""

from __future__ import annotations

from dataclasses import dataclass, field

from respd.service.generation.core import ActiveRuns
from respd.service.limits import InputLimits
from respd.service.media.resolver import MediaResolver
from respd.service.models import ModelRegistry
from respd.service.quotas import KeyQuotas, QuotaSettings
from respd.service.sealing import Sealer
from respd.service.tools.hosted.plan import HostedToolbox
from respd.service.vector_stores.service import VectorStores
from respd.store.base import Store


@dataclass(frozen=True)
class Shared:
    models: ModelRegistry
    store: Store
    media: MediaResolver
    sealer: Sealer
    runs: ActiveRuns = field(default_factory=ActiveRuns)
    limits: InputLimits = field(default_factory=InputLimits)
    # Each identity's rates, concurrent work, background jobs and stored bytes.
    quotas: KeyQuotas = field(default_factory=lambda: KeyQuotas(QuotaSettings()))
    # Vector stores and their search (the `file_search` tool's).
    vector_stores: VectorStores | None = None
    # The tools this server runs for the model: their settings, web search backend, stores.
    toolbox: HostedToolbox = field(default_factory=HostedToolbox)
