"""A message-level engine: any OpenAI-compatible Chat Completions server (vLLM, SGLang,
llama.cpp's llama-server, another respd, a hosted API) behind respd's stateful layer.

Each generation is one streaming `POST /v1/chat/completions` (`wire.py` builds it). The
stream's text, reasoning (`reasoning_content` or `reasoning`) and tool-call deltas come back
as `TokenChunk`s the generation core reads like any engine's (`stream.py` reads them);
usage comes from the final usage chunk. `engine.py` holds the engine and its streams.
"""

from respd.engines.upstream.engine import UpstreamEngine
from respd.engines.upstream.spec import UpstreamSpec
from respd.engines.upstream.stream import UpstreamError, merge_chunks, read_sse
from respd.engines.upstream.wire import request_body, wire_message

__all__ = [
    "UpstreamEngine",
    "UpstreamError",
    "UpstreamSpec",
    "merge_chunks",
    "read_sse",
    "request_body",
    "wire_message",
]
