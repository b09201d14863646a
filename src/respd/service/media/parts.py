"""Content part types, in both APIs' spellings: the one vocabulary storage, media
resolution and lowering read parts by."""

from typing import Literal

TEXT_PARTS = ("input_text", "output_text", "text")
IMAGE_PARTS = ("input_image", "image_url")
FILE_PARTS = ("input_file", "file")

# What an image part becomes for a model without image input: `error`, a 400
# `unsupported_input`; `placeholder`, one line of text saying an image was left out.
ImageFallback = Literal["error", "placeholder"]
DEFAULT_IMAGE_INPUT_FALLBACK: ImageFallback = "error"
