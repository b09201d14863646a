"""Image input for the llama.cpp engine through llama.cpp's multimodal library (mtmd).

A projector GGUF (`--mmproj`) holds a vision encoder whose output lives in the text model's
embedding space. mtmd turns an image into one or more *image chunks* (runs of embeddings
that take prompt positions like tokens), possibly wrapped in text tokens the model family
expects (e.g. `<start_of_image>` … `<end_of_image>`).

In the engine's token lists an image chunk's positions are *placeholder ids*: negative
numbers derived from the image digest, the chunk index and the position, so lengths count
images and prefix matching treats equal images as equal tokens and different images as
different ones. Each image is turned into chunks once and kept in an LRU keyed by its
digest (`Projector.image`); its embeddings are computed once and kept with it. Encoding runs
the vision tower, seconds for a large image on a real model, so the engine hands it to the
projector's own encoder thread (`Projector.encode_later`) and only decodes the result (a
prefill of the image's positions) between its steps; `Projector.embeddings` encodes on the
calling thread instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp

from respd.engines.base import Image

log = logging.getLogger(__name__)


class ProjectorError(Exception):
    """The projector file cannot be used with this model (the server refuses to start)."""


# mtmd reports errors only through its log; the last few are kept for error messages.
_errors: deque[str] = deque(maxlen=8)
_GGML_WARN, _GGML_ERROR = 3, 4  # enum ggml_log_level
_log_callback: Any = None


def _install_log_callback(mtmd: Any) -> None:
    """Route mtmd's log lines (it prints every image batch otherwise) into Python logging."""
    global _log_callback
    if _log_callback is not None:
        return

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace").rstrip()
        if not line:
            return
        if level == _GGML_ERROR:
            _errors.append(line)
            log.warning("mtmd: %s", line)
        elif level == _GGML_WARN:
            log.info("mtmd: %s", line)
        else:
            log.debug("mtmd: %s", line)

    _log_callback = callback  # kept alive: C holds the pointer
    mtmd.mtmd_helper_log_set(callback, ctypes.c_void_p(0))


def _last_errors() -> str:
    lines = [line.split(": error: ")[-1].replace("\n", "; ") for line in _errors]
    _errors.clear()
    return "; ".join(dict.fromkeys(lines)) or "see the log for details"


def placeholder_ids(digest: str, chunk: int, n: int) -> list[int]:
    """`n` negative ids (int32) for positions of image chunk `chunk` of the image `digest`."""
    raw = hashlib.shake_128(f"{digest}:{chunk}".encode()).digest(4 * n)
    return [-1 - (int.from_bytes(raw[4 * i : 4 * i + 4], "little") & 0x7FFFFFFF) for i in range(n)]


# Formats stb_image (inside mtmd's helper) decodes. Anything else goes through Pillow to raw RGB,
# so bytes that are not an image never reach mtmd's audio / video (ffmpeg) fallbacks.
_STB_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")


# `detail: "low"`: the image is shrunk to fit this square first, as OpenAI's low detail
# does. Models with dynamic resolution (Qwen-VL, Pixtral, ...) then give it fewer tokens;
# fixed-resolution projectors resize every image to their own square anyway.
LOW_DETAIL_SIDE = 512


@dataclass(eq=False)
class ImageChunk:
    """One run of image embeddings in a prompt."""

    ptr: int  # mtmd_input_chunk * (owned by `owner`)
    n_tokens: int
    # Positions the chunk advances the sequence by: `n_tokens`, except on M-RoPE models,
    # whose image tokens share positions (all sit at the chunk's first position in the KV
    # cache, with their row and column as extra coordinates).
    n_pos: int
    placeholders: list[int]
    owner: ImageEntry
    embd: Any = None  # ctypes float array once encoded (set under the projector's lock)


@dataclass(eq=False)
class ImageEntry:
    """An image tokenized by mtmd: its tokens (text and placeholders) and image chunks."""

    digest: str
    tokens: list[int] = field(default_factory=list)
    chunks: list[ImageChunk] = field(default_factory=list)
    _native: Any = None  # mtmd_input_chunks *
    _free: Any = None

    def __del__(self) -> None:  # the last reference (LRU or a running job) frees it
        if self._native is not None and self._free is not None:
            self._free(self._native)
            self._native = None


class Projector:
    """An mtmd context for one text model: tokenizes, encodes and decodes images."""

    def __init__(
        self,
        path: Path,
        model: Any,  # llama_cpp._internals.LlamaModel
        *,
        n_threads: int,
        n_batch: int,
        marker: str,
        max_images: int = 64,
        max_embd_bytes: int = 256 * 2**20,
    ) -> None:
        try:
            import llama_cpp.mtmd_cpp as mtmd
        except (ImportError, OSError) as exc:  # a wheel built without libmtmd
            raise ProjectorError(f"this llama-cpp-python build has no libmtmd ({exc})") from exc
        self._mtmd = mtmd
        _install_log_callback(mtmd)
        self._model = model
        self._n_batch = n_batch
        self._marker = marker.encode()
        params = mtmd.mtmd_context_params_default()
        params.n_threads = n_threads
        params.print_timings = False
        params.media_marker = self._marker
        _errors.clear()
        ctx = mtmd.mtmd_init_from_file(str(path).encode(), model.model, params)
        if not ctx:
            raise ProjectorError(_last_errors())
        self._ctx = ctx
        try:
            if not mtmd.mtmd_support_vision(ctx):
                raise ProjectorError(
                    "it has no vision encoder (audio projectors are not supported)"
                )
        except ProjectorError:
            mtmd.mtmd_free(ctx)
            raise
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))
        # M-RoPE models (the Qwen2/2.5/3-VL family) place an image's tokens on a grid: they
        # take max(rows, columns) positions, fewer than their tokens (see `ImageChunk.n_pos`).
        self.mrope = bool(mtmd.mtmd_decode_use_mrope(ctx))
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model.model))
        self._entries: OrderedDict[str, ImageEntry] = OrderedDict()
        self._max_images = max_images
        self._max_embd_bytes = max_embd_bytes
        self._embd_bytes = 0
        self._lock = threading.Lock()
        self.tokenized = 0  # images tokenized (cache misses), for the engine's stats
        self.encoded = 0  # image chunks run through the vision encoder
        # mtmd keeps one output buffer per context: an encode and the read of its output
        # must not interleave with another encode.
        self._encoding = threading.Lock()
        # One encoder thread: encodes run one at a time, in the order asked for, each with
        # the context's `n_threads`.
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtmd-encode")
        self._inflight: dict[ImageChunk, Future[Any]] = {}  # queued or running encodes

    # -- tokenizing (any thread) -----------------------------------------------------------

    def image(self, image: Image) -> ImageEntry:
        """The chunks of `image`, from the LRU or tokenized now. Raises ValueError when the
        bytes are not an image mtmd can use."""
        # A low-detail image is another image (other pixels, fewer tokens on models with
        # dynamic resolution), so it has its own entry and placeholder ids.
        low = image.detail == "low"
        digest = f"{image.digest}:low" if low else image.digest
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
                return entry
            entry = self._tokenize_image(image, digest, fit=LOW_DETAIL_SIDE if low else None)
            self._entries[digest] = entry
            while len(self._entries) > self._max_images:
                self._evict()
            return entry

    def _bitmap(self, image: Image, fit: int | None) -> Any:
        mtmd = self._mtmd
        data = image.data
        if fit is not None or not data.startswith(_STB_MAGIC):
            bitmap = self._bitmap_via_pillow(data, fit)
        else:
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False)
        if not bitmap:
            raise ValueError("image could not be decoded")
        if mtmd.mtmd_bitmap_is_audio(bitmap):
            mtmd.mtmd_bitmap_free(bitmap)
            raise ValueError("image could not be decoded")
        return bitmap

    def _bitmap_via_pillow(self, data: bytes, fit: int | None = None) -> Any:
        """Raw RGB through Pillow, shrunk (keeping its aspect) to fit a `fit`-pixel square."""
        try:
            import io

            from PIL import Image as PILImage

            with PILImage.open(io.BytesIO(data)) as img:
                rgb = img.convert("RGB")
                if fit is not None and max(rgb.size) > fit:
                    rgb.thumbnail((fit, fit), PILImage.Resampling.BICUBIC)
                raw = rgb.tobytes()
                nx, ny = rgb.size
        except Exception:  # not an image Pillow (if installed) can read
            return None
        buf = (ctypes.c_ubyte * len(raw)).from_buffer_copy(raw)
        return self._mtmd.mtmd_bitmap_init(nx, ny, buf)

    def _tokenize_image(self, image: Image, digest: str, fit: int | None) -> ImageEntry:
        mtmd = self._mtmd
        bitmap = self._bitmap(image, fit)
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            mtmd.mtmd_bitmap_set_id(bitmap, digest.encode())
            text = mtmd.mtmd_input_text(self._marker, len(self._marker), False, True)
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            _errors.clear()
            rc = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1)
        finally:
            mtmd.mtmd_bitmap_free(bitmap)
        entry = ImageEntry(digest, _native=chunks, _free=mtmd.mtmd_input_chunks_free)
        if rc != 0:
            raise ValueError(f"image could not be processed: {_last_errors()}")
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                toks = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                entry.tokens.extend(toks[j] for j in range(n.value))
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise ValueError("image could not be decoded")
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            if n_pos != n_tokens and not self.mrope:
                raise ValueError(
                    "images whose positions differ from their tokens are not supported"
                )
            if self.non_causal and n_tokens > self._n_batch:
                raise ValueError(
                    f"an image takes {n_tokens} tokens, more than the batch size "
                    f"({self._n_batch}) this model needs to decode it at once; raise --batch-size"
                )
            ids = placeholder_ids(digest, len(entry.chunks), n_tokens)
            entry.chunks.append(ImageChunk(chunk, n_tokens, n_pos, ids, entry))
            entry.tokens.extend(ids)
        self.tokenized += 1
        return entry

    def _evict(self) -> None:
        _, old = self._entries.popitem(last=False)
        for chunk in old.chunks:
            if chunk.embd is not None:
                self._embd_bytes -= ctypes.sizeof(chunk.embd)

    # -- encoding (any thread) and decoding (the engine's worker thread only) ---------------

    def encode_later(self, chunk: ImageChunk, done: Callable[[], None]) -> Future[Any]:
        """The chunk's embeddings as a future, encoded on the encoder thread: done already
        when an earlier request left them, and the same future as an encode of the chunk
        already queued or running. `done` is called once the future is done, however it
        ends (a failed encode is its exception; a cancelled one, when the projector closes,
        leaves it cancelled)."""
        with self._lock:
            future = self._inflight.get(chunk)
            if future is None:
                if chunk.embd is not None:
                    future = Future()
                    future.set_result(chunk.embd)
                else:
                    try:
                        future = self._encoder.submit(self._encode_in_background, chunk)
                    except RuntimeError:  # closed: nothing will ever encode it
                        future = Future()
                        future.set_exception(RuntimeError("the projector is closed"))
                    else:
                        self._inflight[chunk] = future
        future.add_done_callback(lambda _: done())
        return future

    @property
    def encoding(self) -> bool:
        """Whether an encode is queued or running on the encoder thread."""
        return bool(self._inflight)

    def _encode_in_background(self, chunk: ImageChunk) -> Any:
        try:
            return self.embeddings(chunk)
        finally:
            # Before the future is done: a request arriving after it finds the cached
            # embeddings (or, after a failure, tries again).
            with self._lock:
                self._inflight.pop(chunk, None)

    def embeddings(self, chunk: ImageChunk) -> Any:
        """The chunk's embeddings, encoded now (on this thread) unless an earlier request
        left them."""
        with self._encoding:
            return self._encode_now(chunk)

    def _encode_now(self, chunk: ImageChunk) -> Any:
        if chunk.embd is not None:
            return chunk.embd
        _errors.clear()
        if self._mtmd.mtmd_encode_chunk(self._ctx, chunk.ptr) != 0:
            raise RuntimeError(f"image encoding failed: {_last_errors()}")
        n = chunk.n_tokens * self.n_embd
        out = (ctypes.c_float * n)()
        ctypes.memmove(out, self._mtmd.mtmd_get_output_embd(self._ctx), ctypes.sizeof(out))
        with self._lock:
            self.encoded += 1
            chunk.embd = out
            if chunk.owner.digest in self._entries:
                self._embd_bytes += ctypes.sizeof(out)
                while self._embd_bytes > self._max_embd_bytes and len(self._entries) > 1:
                    self._evict()
        return out

    def decode(self, lctx: Any, chunk: ImageChunk, embd: Any, pos: int, seq_id: int) -> None:
        """Decode a chunk's embeddings into sequence `seq_id` at positions `pos`…"""
        new_pos = llama_cpp.llama_pos(0)
        _errors.clear()
        rc = self._mtmd.mtmd_helper_decode_image_chunk(
            self._ctx, lctx, chunk.ptr, embd, pos, seq_id, self._n_batch,
            ctypes.byref(new_pos), self._mtmd.mtmd_helper_post_decode_callback(), None,
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"decoding the image failed ({rc}): {_last_errors()}")

    def close(self) -> None:
        # Queued encodes are cancelled (their waiters see a cancelled future); a running
        # one is waited for, since it still uses the context freed below.
        self._encoder.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._inflight.clear()
            self._entries.clear()
            self._embd_bytes = 0
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None
