"""respd: an OpenAI-compatible LLM server whose first-class API is the Responses API."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("respd")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+local"
