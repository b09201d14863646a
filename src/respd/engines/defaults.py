"""Defaults of the in-process llama.cpp engine, shared by its constructor and by
`respd serve`'s flags: a module of its own, so that reading the flags does not load
llama.cpp."""

from __future__ import annotations

from typing import Literal

ImageEncode = Literal["background", "inline"]
JumpForward = Literal["auto", "on", "off"]

CTX_SIZE = 4096  # tokens of context per sequence
BATCH_SIZE = 512  # tokens per decode call
PARALLEL = 4  # sequences decoded together (slots)
MAX_QUEUE = 64  # requests waiting for a slot
IMAGE_ENCODE: ImageEncode = "background"
JUMP_FORWARD: JumpForward = "auto"  # on where a step of several tokens costs less per token
POLL = 0  # idle decode threads sleep at once: they yield the cores to other work
IMAGE_THREADS = 1  # threads encoding images in the background
