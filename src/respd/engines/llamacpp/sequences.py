"""The slots' KV sequences as llama.cpp state: copied from slot to slot, and kept in the KV
tiers (`kvtier.py`) past the slot that held them, to be restored into another.

A sequence's state holds only the cells in use, so it is how a prefix crosses KV streams
(see `KvSequences.copy`) as well as what the tiers store.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _internals as internals

from respd.engines.base import EngineStats
from respd.engines.llamacpp.jobs import Job
from respd.engines.llamacpp.kvtier import MIN_SAVE_TOKENS, KVTier, TierMatch, model_identity
from respd.engines.llamacpp.slots import Slot, common_prefix

log = logging.getLogger(__name__)


def open_kv_tier(
    model_path: Path, cparams: Any, ram_bytes: int, disk_dir: Path | None, disk_bytes: int
) -> KVTier | None:
    """The KV tiers for a context made with `cparams` (None when every size is zero)."""
    if ram_bytes <= 0 and (disk_dir is None or disk_bytes <= 0):
        return None
    # A saved state is valid only for the same model and the same context layout
    # (llama.cpp refuses one saved with another number of sequences, for instance).
    identity = model_identity(
        model_path,
        n_ctx=cparams.n_ctx,
        n_seq_max=cparams.n_seq_max,
        kv_unified=cparams.kv_unified,
        type_k=cparams.type_k,
        type_v=cparams.type_v,
        flash_attn=cparams.flash_attn_type,
        state_version=llama_cpp.LLAMA_STATE_SEQ_VERSION,
        llama_cpp=llama_cpp.__version__,
    )
    return KVTier(identity, ram_bytes=ram_bytes, disk_dir=disk_dir, disk_bytes=disk_bytes)


class KvSequences:
    """Copies, saves and restores the KV sequences of `slots` in `ctx`, with `tier` (None:
    copies only). The decode worker's thread alone uses it, but for the save at close,
    once that thread is gone."""

    def __init__(
        self,
        ctx: internals.LlamaContext,
        tier: KVTier | None,
        slots: Sequence[Slot],
        stats: EngineStats,
    ) -> None:
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx.ctx)
        self.tier = tier
        self._slots = slots
        self._stats = stats

    def state(self, seq: int) -> tuple[ctypes.Array[ctypes.c_uint8], int] | None:
        """`seq`'s KV cells serialised by llama.cpp: (buffer, bytes used), or None."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buf, size, seq)
        return (buf, n) if n else None

    def copy(self, src: Slot, dst: Slot) -> bool:
        """Put a copy of `src`'s KV cells in `dst`'s sequence, whose old cells go first.

        Through the sequence state rather than `llama_memory_seq_cp`: across KV streams
        that copies the whole stream buffer, at the cost of the context size and making
        every page of the target stream resident; the state holds only the cells in use.
        The caller then drops what follows the shared prefix."""
        llama_cpp.llama_memory_seq_rm(self._mem, dst.seq_id, -1, -1)
        dst.tokens = []
        state = self.state(src.seq_id)
        if state is not None and llama_cpp.llama_state_seq_set_data(
            self._ctx.ctx, state[0], state[1], dst.seq_id
        ):
            return True
        log.warning("copying a KV sequence between slots failed; the prefix is decoded again")
        llama_cpp.llama_memory_seq_rm(self._mem, dst.seq_id, -1, -1)
        return False

    def use_tier(
        self, job: Job, slot: Slot, reuse: int, copy_from: Slot | None
    ) -> tuple[int, Slot | None]:
        """Before `slot` takes `job`: save the slot's sequence when the placement would lose
        a long part of it that nothing else holds, then restore a saved prefix of the
        prompt when it is longer than any slot offers. Returns the placement's (reuse,
        copy_from) after that."""
        tier = self.tier
        assert tier is not None
        match = None
        if not job.images:  # prompts with images skip the tiers: simpler, and rarely long
            limit = max(len(job.prompt) - 1, 0)
            match = tier.find(job.prompt, limit, have=reuse, cache_key=job.cache_key)
        kept = min(common_prefix(slot.tokens, job.prompt), reuse if match is None else match.reuse)
        self.save(slot, kept)
        if match is None:
            return reuse, copy_from
        if self.restore(slot, match):
            self._stats.add("kv_restored_tokens", match.reuse)
            return match.reuse, None
        if copy_from is None:
            reuse = min(reuse, len(slot.tokens))  # a failed restore has emptied the slot
        return reuse, copy_from

    def save(self, slot: Slot, kept: int, *, slots_stay: bool = True) -> bool:
        """Put `slot`'s KV sequence in the tier, unless what would be lost past the `kept`
        tokens is short, or held by the tier already or (while `slots_stay`) another slot."""
        tier = self.tier
        assert tier is not None
        tokens = slot.tokens
        if len(tokens) - kept < MIN_SAVE_TOKENS or min(tokens) < 0:
            return False  # too little to lose, or image positions (no lookup uses them)
        others = [s for s in self._slots if s is not slot] if slots_stay else []
        elsewhere = max((common_prefix(tokens, s.tokens) for s in others), default=0)
        if len(tokens) - max(kept, elsewhere, tier.covers(tokens)) < MIN_SAVE_TOKENS:
            return False
        seq = slot.seq_id
        # The sequence must hold exactly positions 0..n-1, else its state is not `tokens`'.
        held = (
            llama_cpp.llama_memory_seq_pos_min(self._mem, seq),
            llama_cpp.llama_memory_seq_pos_max(self._mem, seq),
        )
        if held != (0, len(tokens) - 1):
            return False
        state = self.state(seq)
        if state is None:
            return False
        data = memoryview(state[0])[: state[1]].tobytes()
        return tier.put(tokens, data, slot.cache_key, retain=slot.retain)

    def restore(self, slot: Slot, match: TierMatch) -> bool:
        """Load `match`'s saved state into `slot`'s sequence (its old cells go first); on
        False the slot is as it was, or empty when llama.cpp refused the state."""
        tier = self.tier
        assert tier is not None
        state = tier.load(match)
        if state is None:
            return False
        seq = slot.seq_id
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        slot.tokens = []
        # A pointer into `state` itself (no copy of what may be hundreds of MB).
        src = ctypes.cast(ctypes.c_char_p(state), ctypes.POINTER(ctypes.c_uint8))
        if llama_cpp.llama_state_seq_set_data(self._ctx.ctx, src, len(state), seq) == 0:
            log.warning("llama.cpp refused a saved KV state; it is dropped")
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
            tier.discard(match.id)
            return False
        slot.tokens = list(match.tokens)
        return True
