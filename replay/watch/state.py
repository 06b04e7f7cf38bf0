"""What a watch has done, kept in its folder so a restarted watch resumes where it stopped.

``<out>/watch-state.json``, rewritten whole (temp file + ``os.replace``) after each request::

    {"format": 1, "serve": "<abs path of the serving trace>",
     "segments": ["train-0000.trace", ...],           # one training trace per watch run
     "requests": {"<key>": {"seq": 3, "segment": 0, "diverged": false, "first": null,
                            "acceptance": {"train": {...}, "serve": {...}}, ...}, ...}}

A request enters ``requests`` only after its training rows are flushed to its segment's journal
(a SIGKILL between the two replays that request again in the next run, never skips it). Each
run writes a new segment: a trace cannot be reopened for appending (``tracer.store.TraceWriter``),
and a killed run's segment stays readable as an unclosed trace.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specdiff.tracer.errors import SpecdiffError

STATE_NAME = "watch-state.json"
STATE_FORMAT = 1


class WatchStateError(SpecdiffError):
    """The watch folder holds something this watch cannot resume from."""


class WatchState:
    """The state file of one watch folder (see the module docstring).

    Args:
        out: the watch folder (created if missing).
        serve: the serving trace being watched; a folder that watched another trace is refused.

    Raises:
        WatchStateError: the state file is unreadable, of another format, or for another trace.
    """

    def __init__(self, out: str | Path, serve: str):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / STATE_NAME
        self.serve = _abs(serve)
        self.segments: list[str] = []
        self.requests: dict[str, dict] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError) as e:
                raise WatchStateError(f"{self.path}: unreadable watch state ({e}); remove it to start over") from None
            if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
                raise WatchStateError(f"{self.path}: not a specdiff watch state of format {STATE_FORMAT}")
            if data.get("serve") != self.serve:
                raise WatchStateError(f"{self.out}: holds the watch of {data.get('serve')}, not {self.serve}; "
                                      "give another --out")
            self.segments = list(data.get("segments", []))
            self.requests = dict(data.get("requests", {}))
        self.resumed = len(self.requests)

    def new_segment(self) -> Path:
        """The path of this run's training trace (registered; the trace itself is made later)."""
        name = f"train-{len(self.segments):04d}.trace"
        self.segments.append(name)
        self.save()
        return self.out / name

    def done(self, key: str) -> bool:
        """Whether request ``key`` was replayed and diffed by this or an earlier run."""
        return key in self.requests

    def mark(self, key: str, record: dict) -> None:
        """Record request ``key`` as replayed and diffed, and save."""
        self.requests[key] = record
        self.save()

    def save(self) -> None:
        """Write the state to a temporary file, then ``os.replace`` it: a killed watch leaves the old
        state or the new one, never half of one."""
        tmp = self.path.with_name(f"{STATE_NAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": STATE_FORMAT, "serve": self.serve, "segments": self.segments,
                                   "requests": self.requests}, indent=1))
        os.replace(tmp, self.path)


def _abs(path: str) -> str:
    return str(path) if "://" in str(path) else os.path.abspath(str(path))
