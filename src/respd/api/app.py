"""The FastAPI application factory: routes, error handling, and the services they call."""

from __future__ import annotations

import time

from fastapi import FastAPI

from respd import __version__
from respd.api import chat, models, responses
from respd.api.errors import RequestIdMiddleware, install_error_handlers
from respd.engines.base import Engine
from respd.service.chat import ChatService
from respd.service.responses import ResponsesService
from respd.service.sampling import SamplingDefaults


def create_app(engine: Engine, defaults: SamplingDefaults | None = None) -> FastAPI:
    defaults = defaults or SamplingDefaults()
    app = FastAPI(title="respd", version=__version__)
    app.state.engine = engine
    app.state.started_at = int(time.time())
    app.state.responses = ResponsesService(engine, defaults)
    app.state.chat = ChatService(engine, defaults)
    install_error_handlers(app)
    app.include_router(responses.router)
    app.include_router(chat.router)
    app.include_router(models.router)
    app.add_middleware(RequestIdMiddleware)
    return app
