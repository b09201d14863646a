"""The flags of images and documents in requests: how large, from where, cached how long.

Their defaults are `MediaSettings`' own, the settings this model hands the media resolver."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from respd.service.media.cache import DEFAULT_MEDIA_CACHE_MB
from respd.service.media.parts import ImageFallback
from respd.service.media.resolver import MediaSettings

MIB = 2**20


class MediaConfig(BaseModel):
    model_config = ConfigDict(title="Images and files in input")

    max_image_bytes: int = Field(
        MediaSettings.max_image_bytes,
        ge=1,
        description="Largest image file (encoded bytes, after base64 decoding) accepted in "
        "input; more is a 400.",
    )
    max_image_pixels: int = Field(
        MediaSettings.max_image_pixels,
        ge=1,
        description="Most pixels (width x height) an input image may decode to; more is a 400 "
        "(decompression bombs included).",
    )
    max_image_side: int = Field(
        MediaSettings.max_image_side,
        ge=1,
        description="Longest width or height in pixels of an input image.",
    )
    max_input_file_bytes: int = Field(
        MediaSettings.max_input_file_bytes,
        ge=1,
        description="Largest document an input_file part may give inline (file_data) or by "
        "file_url; more is a 400 (a file_id is bounded by the upload limit).",
    )
    allow_remote_media: bool = Field(
        MediaSettings.allow_remote_media,
        description="Fetch http(s) image_url / file_url inputs. Off: such URLs are a 400. "
        "On: hosts resolving to loopback, private, link-local or reserved addresses are "
        "refused at every redirect hop.",
    )
    remote_media_timeout_secs: float = Field(
        MediaSettings.remote_media_timeout_secs,
        gt=0,
        description="Time limit for fetching one remote image or file.",
    )
    media_url_cache_ttl_secs: float = Field(
        MediaSettings.url_cache_ttl_secs,
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
        MediaSettings.image_input_fallback,
        description="Images sent to a model without image input (no --mmproj): error, a 400 "
        "unsupported_input; placeholder, each image (still fetched and checked) becomes one "
        "line of text such as '[image: 640x480 image/png omitted; this model cannot see "
        "images]', so agents that attach screenshots to tool results keep working.",
    )

    def media_settings(self) -> MediaSettings:
        return MediaSettings(
            max_image_bytes=self.max_image_bytes,
            max_image_pixels=self.max_image_pixels,
            max_image_side=self.max_image_side,
            max_input_file_bytes=self.max_input_file_bytes,
            allow_remote_media=self.allow_remote_media,
            remote_media_timeout_secs=self.remote_media_timeout_secs,
            cache_bytes=self.media_cache_mb * MIB,
            url_cache_ttl_secs=self.media_url_cache_ttl_secs,
            image_input_fallback=self.image_input_fallback,
        )
