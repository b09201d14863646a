"""Content part types, in both APIs' spellings: the one vocabulary storage, media
resolution and lowering read parts by."""

TEXT_PARTS = ("input_text", "output_text", "text")
IMAGE_PARTS = ("input_image", "image_url")
FILE_PARTS = ("input_file", "file")
