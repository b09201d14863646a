"""The default engine: GGUF models in-process through llama.cpp (llama-cpp-python)."""

from respd.engines.llamacpp.engine import LlamaCppEngine
from respd.engines.llamacpp.loading import cpu_advertises_amx
from respd.engines.llamacpp.multimodal import ProjectorError

__all__ = ["LlamaCppEngine", "ProjectorError", "cpu_advertises_amx"]
