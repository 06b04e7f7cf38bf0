"""A rolling per-depth acceptance of both sides over the last requests watched.

Each request brings the diff's acceptance of each side (``replay.diff.compare.acceptance.Acceptance``:
serving from ``verify.accept_length``, training from ``draft.accept_cum``, the two rules of
``specdiff.eagle3.acceptance``). The window pools the last ``window`` requests, each weighted by
its ``samples`` (verify steps on serving, generated positions on training), so the pooled rate
is the one those requests' rows give together.
"""

from __future__ import annotations

from collections import deque

SIDES = ("train", "serve")


def acceptance_record(acc) -> dict:
    """A JSON-safe record of one side's ``Acceptance`` (per_depth list or None, mean, samples)."""
    return {"per_depth": None if acc.per_depth is None else [float(v) for v in acc.per_depth],
            "mean_accept_length": None if acc.mean_accept_length is None else float(acc.mean_accept_length),
            "samples": int(acc.samples)}


class RollingAcceptance:
    """Per side, the last ``window`` requests' acceptance records (``acceptance_record``)."""

    def __init__(self, window: int = 32):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._recent = {side: deque(maxlen=window) for side in SIDES}

    def add(self, side: str, record: dict) -> None:
        """Add one request's record of ``side``; records without samples or per-depth rates are
        kept out (a side that recorded no acceptance for that request)."""
        if record.get("per_depth") is not None and record.get("samples"):
            self._recent[side].append(record)

    def summary(self, side: str) -> dict:
        """``{"per_depth": [..] | None, "mean_accept_length": float | None, "requests": n}`` pooled
        over the window (weights: samples)."""
        recs = list(self._recent[side])
        if not recs:
            return {"per_depth": None, "mean_accept_length": None, "requests": 0}
        depth = max(len(r["per_depth"]) for r in recs)
        per, weight = [0.0] * depth, [0.0] * depth
        mean_num = mean_den = 0.0
        for r in recs:
            w = float(r["samples"])
            for d, v in enumerate(r["per_depth"]):
                per[d] += w * v
                weight[d] += w
            if r["mean_accept_length"] is not None:
                mean_num += w * r["mean_accept_length"]
                mean_den += w
        return {"per_depth": [p / w if w else 0.0 for p, w in zip(per, weight, strict=True)],
                "mean_accept_length": mean_num / mean_den if mean_den else None, "requests": len(recs)}
