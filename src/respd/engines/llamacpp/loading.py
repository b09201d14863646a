"""Loading a GGUF's weights through llama.cpp, with the CPU weight layout decided once.

Both the generating engine and the embedding context load through here, so that neither
meets ggml's AMX kernels where they cannot run."""

from __future__ import annotations

import logging
from pathlib import Path

import llama_cpp
from llama_cpp import _internals as internals
from llama_cpp._logger import set_verbose as set_llama_verbose

log = logging.getLogger(__name__)


def cpu_advertises_amx() -> bool:
    """Whether /proc/cpuinfo lists AMX (Linux only; elsewhere False)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and " amx_int8" in line for line in cpuinfo.splitlines())


def load_model(model_path: Path, repack: bool | None) -> internals.LlamaModel:
    """The model's weights. `repack` None: repacked (AMX / tiled) buffers except on CPUs
    that advertise AMX, where ggml's AMX kernels die of an illegal instruction in some VMs
    (a tile instruction the hypervisor does not run; seen on Firecracker)."""
    set_llama_verbose(log.isEnabledFor(logging.DEBUG))  # llama.cpp's own chatter
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.use_extra_bufts = (not cpu_advertises_amx()) if repack is None else repack
    return internals.LlamaModel(path_model=str(model_path), params=mparams, verbose=False)
