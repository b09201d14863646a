"""The default engine: GGUF models in-process through llama.cpp (llama-cpp-python)."""

from respd.engines.waiting import default_wait_policy

default_wait_policy()  # before llama.cpp, and the OpenMP runtime it links, load below

from respd.engines.llamacpp.engine import LlamaCppEngine  # noqa: E402
from respd.engines.llamacpp.loading import cpu_advertises_amx  # noqa: E402
from respd.engines.llamacpp.multimodal import ProjectorError  # noqa: E402

__all__ = ["LlamaCppEngine", "ProjectorError", "cpu_advertises_amx"]
