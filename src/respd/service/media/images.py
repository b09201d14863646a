"""Images checked by decoding them with Pillow within the `--max-image-*` limits."""

from __future__ import annotations

import io
import warnings

from respd.protocol.errors import InvalidRequest
from respd.service.media.errors import bad, too_many_bytes
from respd.service.media.settings import MediaSettings
from respd.service.media.values import GENERIC_TYPES, CheckedImage

# Pillow format name → the MIME type an engine is told.
IMAGE_FORMATS = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
}
_MIME_ALIASES = {
    "image/jpg": "image/jpeg",
    "image/x-ms-bmp": "image/bmp",
    "image/x-bmp": "image/bmp",
}


def check_image(data: bytes, declared: str, param: str, settings: MediaSettings) -> CheckedImage:
    """Decode `data` with Pillow within the limits; the returned Image carries the MIME type
    of the format actually found (a mislabelled PNG is still a PNG)."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    if not data:
        raise bad(f"Invalid '{param}': the image is empty.", param, "empty_image_file")
    if len(data) > settings.max_image_bytes:
        raise too_many_bytes(param, "image", settings.max_image_bytes)
    declared = _MIME_ALIASES.get(declared, declared)
    if declared not in GENERIC_TYPES and declared not in IMAGE_FORMATS.values():
        raise _unsupported_image(declared, param)
    too_large = bad(
        f"Invalid '{param}': the image is too large; at most {settings.max_image_side} pixels "
        f"a side and {settings.max_image_pixels} pixels in all are accepted.",
        param,
        "image_too_large",
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data)) as img:
                fmt = img.format or ""
                if fmt not in IMAGE_FORMATS:
                    raise _unsupported_image(
                        img.get_format_mimetype() or f"image/{fmt.lower()}", param
                    )
                width, height = img.size
                if (
                    max(width, height) > settings.max_image_side
                    or width * height > settings.max_image_pixels
                ):
                    raise too_large
                img.load()  # decode every pixel: truncated or corrupt data fails here
    except (PILImage.DecompressionBombError, PILImage.DecompressionBombWarning):
        raise too_large from None
    except UnidentifiedImageError:
        raise bad(
            f"Invalid '{param}': the data is not an image in a supported format "
            f"({', '.join(IMAGE_FORMATS.values())}).",
            param,
            "invalid_image",
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise bad(
            f"Invalid '{param}': the image could not be decoded ({exc}).", param, "invalid_image"
        ) from None
    return CheckedImage(data, IMAGE_FORMATS[fmt], width=width, height=height)


def _unsupported_image(mime: str, param: str) -> InvalidRequest:
    return bad(
        f"Invalid '{param}': unsupported image type '{mime}'. Supported types: "
        f"{', '.join(IMAGE_FORMATS.values())}.",
        param,
        "unsupported_image_media_type",
    )
