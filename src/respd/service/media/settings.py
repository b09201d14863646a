"""The limits and switches media resolution runs under."""

from __future__ import annotations

from dataclasses import dataclass

from respd.service.media.cache import DEFAULT_MEDIA_CACHE_MB, DEFAULT_URL_CACHE_TTL_SECS
from respd.service.media.parts import DEFAULT_IMAGE_INPUT_FALLBACK, ImageFallback

MIB = 2**20


@dataclass(frozen=True)
class MediaSettings:
    """Limits and switches for media in requests (the `--max-image-*`, `--max-file-bytes`
    and `--*-remote-media*` flags)."""

    max_image_bytes: int = 20 * MIB  # the encoded image file
    max_image_pixels: int = 33_177_600  # width x height once decoded
    max_image_side: int = 8192  # width or height
    max_input_file_bytes: int = 32 * MIB  # an `input_file` document given inline or by URL
    allow_remote_media: bool = False
    remote_media_timeout_secs: float = 10.0
    cache_bytes: int = DEFAULT_MEDIA_CACHE_MB * MIB  # resolved media kept by source; 0: none
    url_cache_ttl_secs: float = DEFAULT_URL_CACHE_TTL_SECS  # how long a URL's entry holds
    image_input_fallback: ImageFallback = DEFAULT_IMAGE_INPUT_FALLBACK
