"""Engine requests -> trace sequences, shared by every serving recorder's writer thread."""

from __future__ import annotations

import numpy as np


def sequence_id(rec, tw, rid: str, prompt: list[int] | None = None) -> int:
    """The trace sequence id of engine request ``rid``, added to ``tw`` (a ``TraceWriter``) the first
    time the request is seen, with its prompt token ids (int32 [P]; empty when not known yet).

    ``rec`` is the engine's recorder; its writer-thread dicts ``seq_ids`` (rid -> sequence id),
    ``seq_tokens`` (rid -> token ids so far) and ``seq_prompt`` (rid -> prompt length) are updated.
    """
    if rid not in rec.seq_ids:
        toks = list(prompt or [])
        rec.seq_tokens[rid] = toks
        rec.seq_prompt[rid] = len(toks)
        rec.seq_ids[rid] = tw.add_sequence(np.asarray(toks, np.int32), prompt_len=len(toks), rid=rid)
    return rec.seq_ids[rid]
