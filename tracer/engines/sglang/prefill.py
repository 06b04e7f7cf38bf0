"""Per-request prefill facts of the SGLang recorder: the radix-cache hit and the prefill chunks.

Serving records target rows only for the positions a prefill extends (attribution.py: a prefill
with prefix p and extend e writes t = p..p+e-1), so a request whose prefix hit the radix cache has
no rows before the hit, and a chunked prefill runs the draft extend once per chunk. Both matter
to the diff (replay/diff/judge/groups.py, explain/history.py: failures only on cache-hit requests, or at chunk
boundaries), and neither can be told from the rows alone (a chunk's later part has a prefix too).
So the recorder notes, on the serving thread, per recorded request:

- ``cached_prefix``: ``Req.cached_tokens`` when the request is first prefilled (SGLang 0.5.23
  srt/managers/schedule_batch.py:2965-2974: ``pre_len - already_computed`` of the first chunk, the
  radix-cache match; later chunks add 0), ``"unknown"`` when it cannot be read;
- ``chunks``: ``[[start, length], ...]``, each prefill forward of the request
  (``ScheduleBatch.prefix_lens`` / ``extend_lens``, schedule_batch.py:2860-2861); more than one
  means chunked prefill, and each later start is a chunk boundary.

They go into the contract at close as ``request_prefill`` (rid -> facts; the trace's sequence
table gives each sequence's rid).
"""

from __future__ import annotations

from specdiff.tracer.contract import REQUEST_PREFILL as FIELD
from specdiff.tracer.contract import UNKNOWN


class PrefillFacts:
    """Per-request prefill facts collected on the serving thread (module doc)."""

    def __init__(self) -> None:
        self.by_rid: dict[str, dict] = {}

    def note(self, adapter, reqs, rids, prefix_lens: list[int], extend_lens: list[int], keep) -> None:
        """One prefill batch: ``reqs`` (SGLang ``Req`` objects) with their ``rids`` and the batch's
        prefix / extend lengths (ints, one per request); ``keep(rid)``: whether the request is recorded."""
        for req, rid, p, e in zip(reqs, rids, prefix_lens, extend_lens, strict=True):
            if not keep(rid):
                continue
            facts = self.by_rid.get(rid)
            if facts is None:
                hit = adapter.get(req, "Req.cached_tokens")
                cached = int(hit) if isinstance(hit, int) and not isinstance(hit, bool) else UNKNOWN
                facts = self.by_rid[rid] = {"cached_prefix": cached, "chunks": []}
            facts["chunks"].append([int(p), int(e)])

    def contract(self) -> dict:
        """``{FIELD: {rid: facts}}`` for the contract (JSON-safe)."""
        return {FIELD: {rid: {"cached_prefix": f["cached_prefix"], "chunks": [list(c) for c in f["chunks"]]}
                        for rid, f in self.by_rid.items()}}


__all__ = ["FIELD", "PrefillFacts"]
