"""Engine requests -> trace sequences, and which requests are recorded; shared by every serving
recorder (the SGLang and vLLM hooks, and the writer process that attributes their rows:
``writer.child.WriterSide``)."""

from __future__ import annotations

import hashlib
import logging
import re

import numpy as np

from specdiff.tracer.rows import token_list

logger = logging.getLogger("specdiff.tracer")

#: The key a client sets in a request's ``custom_params`` (SGLang: ``sampling_params.custom_params``,
#: srt/sampling/sampling_params.py:180, reaches the scheduler as ``Req.sampling_params``) to ask for
#: (true) or against (false) recording that request, whatever ``SPECDIFF_SAMPLE`` says.
MARK_KEY = "specdiff_record"

#: Why a request is recorded (``sampled_requests`` in the trace's contract).
REASON_ALL = "all"  # no sampling configured: every request (``SPECDIFF_RIDS`` may still filter)
REASON_FRACTION = "fraction"  # sample_unit(rid) < SPECDIFF_SAMPLE
REASON_MARKED = "marked"  # the client set custom_params[MARK_KEY] true


def sequence_id(rec, tw, rid: str, prompt=None) -> int:
    """The trace sequence id of engine request ``rid``, added to ``tw`` (a ``TraceWriter``) the first
    time the request is seen, with its prompt token ids (as the engine held them: ``token_list``;
    written int32 [P]; empty when not known yet).

    ``rec`` is the engine's recorder; its writer-thread dicts ``seq_ids`` (rid -> sequence id),
    ``seq_tokens`` (rid -> token ids so far) and ``seq_prompt`` (rid -> prompt length) are updated.
    """
    if rid not in rec.seq_ids:
        toks = token_list(prompt)
        rec.seq_tokens[rid] = toks
        rec.seq_prompt[rid] = len(toks)
        rec.seq_ids[rid] = tw.add_sequence(np.asarray(toks, np.int32), prompt_len=len(toks), rid=rid)
    return rec.seq_ids[rid]


def sample_unit(rid: str) -> float:
    """The request's sampling draw in [0, 1): the first 8 bytes of blake2b(rid, utf-8) as a
    big-endian integer over 2**64. Deterministic across processes, runs and engines (Python's
    ``hash`` is salted per process), so a watcher can tell which rids a trace should hold."""
    d = hashlib.blake2b(str(rid).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(d, "big") / 18446744073709551616.0


class RequestSampler:
    """Decides, once per request, whether it is recorded and why (hot path: a dict lookup after
    the first decision).

    Args:
        fraction: record requests with ``sample_unit(rid) < fraction``; None records all.
        rids: a regular expression a recorded rid must match (``SPECDIFF_RIDS``), or None.

    A client's mark (``custom_params[MARK_KEY]``) wins over the fraction: true records the request
    (reason ``"marked"``), false skips it. SGLang's ``/health`` probes (rid ``HEALTH_CHECK*``) are
    never recorded. ``decide`` is deterministic in (rid, mark), so forgetting decisions (the cache
    is cleared at ``max_cache`` entries to bound memory) never changes one.
    """

    def __init__(self, fraction: float | None = None, rids: str | None = None, *, max_cache: int = 1 << 16):
        self.fraction = fraction
        self.rid_re = re.compile(rids) if rids else None
        self.max_cache = max_cache
        self._cache: dict[str, str | None] = {}

    @property
    def facts(self) -> dict:
        """The trace's ``sampling`` contract fact: how requests were chosen."""
        return {"fraction": 1.0 if self.fraction is None else float(self.fraction),
                "marker": f"custom_params.{MARK_KEY}",
                "rids": None if self.rid_re is None else self.rid_re.pattern}

    def decide(self, rid: str, mark=None) -> str | None:
        """The reason ``rid`` is recorded (REASON_*), or None when it is not.

        Args:
            rid: the engine's request id.
            mark: the request's ``custom_params`` dict (or None), or a function returning it
                (called only when the rid was not decided yet); only ``MARK_KEY`` is read.
        """
        got = self._cache.get(rid, 0)
        if got != 0:
            return got
        if len(self._cache) >= self.max_cache:
            self._cache.clear()
        got = self._cache[rid] = self._decide(str(rid), mark() if callable(mark) else mark)
        return got

    def _decide(self, rid: str, mark) -> str | None:
        if rid.startswith("HEALTH_CHECK"):  # SGLang's /health probes, not user requests
            return None
        if self.rid_re is not None and not self.rid_re.search(rid):
            return None
        flag = mark.get(MARK_KEY) if isinstance(mark, dict) else None
        if flag is not None:
            return REASON_MARKED if flag in (True, 1, "1", "true", "yes", "on") else None
        if self.fraction is None:
            return REASON_ALL
        return REASON_FRACTION if sample_unit(rid) < self.fraction else None


def is_kept(rid: str, recorded: dict, writer) -> bool:
    """Whether ``rid``'s rows are written by a serving recorder: chosen by the sampler (``recorded``)
    and not dropped by ``writer`` (None before the recorder opened it, e.g. rows attributed by hand)."""
    return rid in recorded and (writer is None or rid not in writer.dropped_rids)


def sampling_facts(recorded: dict[str, str], dropped) -> dict:
    """The contract facts that say which requests a trace holds: ``sampled_requests`` (rid -> why:
    tracer/engines/requests.py REASON_*) and ``dropped_requests`` (the rids of ``dropped``, whose
    later rows were dropped because the writer fell behind; their rows written before the drop stay).

    Only recorded requests are listed as dropped: a writer drops whole iterations, and the requests of a
    dropped iteration the sampler left out were never to be written (measured: 32-50 such names beside
    12 recorded requests dropped, benchmarks/production_load.py at 4x the writer's rate, sample 0.1)."""
    return {"sampled_requests": dict(recorded), "dropped_requests": sorted(r for r in dropped if r in recorded)}
