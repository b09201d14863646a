"""Image input for the llama.cpp engine through llama.cpp's multimodal library (mtmd).

A projector GGUF (`--mmproj`) holds a vision encoder whose output lives in the text model's
embedding space. mtmd turns an image into one or more *image chunks* (runs of embeddings
that take prompt positions like tokens), possibly wrapped in text tokens the model family
expects (e.g. `<start_of_image>` … `<end_of_image>`).

In the engine's token lists an image chunk's positions are *placeholder ids*: negative
numbers derived from the image digest, the chunk index and the position, so lengths count
images and prefix matching treats equal images as equal tokens and different images as
different ones. Each image is turned into chunks once and kept in an LRU keyed by its
digest (`Projector.image`); its embeddings are computed once, on first use, by the engine's
worker thread (`Projector.embeddings`) and kept with it.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from collections import OrderedDict, deque
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


@dataclass(eq=False)
class ImageChunk:
    """One run of image embeddings in a prompt."""

    ptr: int  # mtmd_input_chunk * (owned by `owner`)
    n_tokens: int
    placeholders: list[int]
    owner: ImageEntry
    embd: Any = None  # ctypes float array once encoded (worker thread only)


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
            if mtmd.mtmd_decode_use_mrope(ctx):
                # M-RoPE models (the Qwen2/2.5/3-VL family) give each position 4 coordinates
                # and let an image take fewer positions than tokens; the batched decoder
                # keeps one position per token.
                raise ProjectorError(
                    "the model uses M-RoPE image positions (Qwen-VL family), which respd's "
                    "batched engine does not support yet"
                )
        except ProjectorError:
            mtmd.mtmd_free(ctx)
            raise
        self.non_causal = bool(mtmd.mtmd_decode_use_non_causal(ctx, None))
        self.n_embd = int(llama_cpp.llama_model_n_embd_inp(model.model))
        self._entries: OrderedDict[str, ImageEntry] = OrderedDict()
        self._max_images = max_images
        self._max_embd_bytes = max_embd_bytes
        self._embd_bytes = 0
        self._lock = threading.Lock()

    # -- tokenizing (any thread) -----------------------------------------------------------

    def image(self, image: Image) -> ImageEntry:
        """The chunks of `image`, from the LRU or tokenized now. Raises ValueError when the
        bytes are not an image mtmd can use."""
        digest = image.digest
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                self._entries.move_to_end(digest)
                return entry
            entry = self._tokenize_image(image, digest)
            self._entries[digest] = entry
            while len(self._entries) > self._max_images:
                self._evict()
            return entry

    def _bitmap(self, image: Image) -> Any:
        mtmd = self._mtmd
        data = image.data
        if data.startswith(_STB_MAGIC):
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(data), False)
        else:
            bitmap = self._bitmap_via_pillow(data)
        if not bitmap:
            raise ValueError("image could not be decoded")
        if mtmd.mtmd_bitmap_is_audio(bitmap):
            mtmd.mtmd_bitmap_free(bitmap)
            raise ValueError("image could not be decoded")
        return bitmap

    def _bitmap_via_pillow(self, data: bytes) -> Any:
        try:
            import io

            from PIL import Image as PILImage

            with PILImage.open(io.BytesIO(data)) as img:
                rgb = img.convert("RGB")
                raw = rgb.tobytes()
                nx, ny = rgb.size
        except Exception:  # not an image Pillow (if installed) can read
            return None
        buf = (ctypes.c_ubyte * len(raw)).from_buffer_copy(raw)
        return self._mtmd.mtmd_bitmap_init(nx, ny, buf)

    def _tokenize_image(self, image: Image, digest: str) -> ImageEntry:
        mtmd = self._mtmd
        bitmap = self._bitmap(image)
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
            if int(mtmd.mtmd_input_chunk_get_n_pos(chunk)) != n_tokens:
                raise ValueError(
                    "images whose positions differ from their tokens are not supported"
                )
            if self.non_causal and n_tokens > self._n_batch:
                raise ValueError(
                    f"an image takes {n_tokens} tokens, more than the batch size "
                    f"({self._n_batch}) this model needs to decode it at once; raise --batch-size"
                )
            ids = placeholder_ids(digest, len(entry.chunks), n_tokens)
            entry.chunks.append(ImageChunk(chunk, n_tokens, ids, entry))
            entry.tokens.extend(ids)
        return entry

    def _evict(self) -> None:
        _, old = self._entries.popitem(last=False)
        for chunk in old.chunks:
            if chunk.embd is not None:
                self._embd_bytes -= ctypes.sizeof(chunk.embd)

    # -- encoding and decoding (the engine's worker thread only) ---------------------------

    def embeddings(self, chunk: ImageChunk) -> Any:
        """The chunk's embeddings, encoded now unless an earlier request left them."""
        if chunk.embd is not None:
            return chunk.embd
        _errors.clear()
        if self._mtmd.mtmd_encode_chunk(self._ctx, chunk.ptr) != 0:
            raise RuntimeError(f"image encoding failed: {_last_errors()}")
        n = chunk.n_tokens * self.n_embd
        out = (ctypes.c_float * n)()
        ctypes.memmove(out, self._mtmd.mtmd_get_output_embd(self._ctx), ctypes.sizeof(out))
        with self._lock:
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
        with self._lock:
            self._entries.clear()
            self._embd_bytes = 0
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None
