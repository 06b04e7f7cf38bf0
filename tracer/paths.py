"""The file paths a trace's contract names (``model_name``, ``draft_name``, ``replay_of``): written
absolute when recorded, and read back the same from any working directory.

Recorders write ``recorded_path(p)``: a path that names a local file or directory is made absolute
against the recorder's working directory at record time (symlinks kept as given); anything else
(a hub id, a URL) is written as given. ``SPECDIFF_RECORD_RELATIVE_TO=DIR`` makes paths under DIR
relative to it instead: traces meant to be shipped inside a repository (traces/examples), which must
name the models as a fresh clone holds them.

Readers call ``contract_path(trace, fact)``. An absolute path is used as it is. A relative one (a
trace recorded before paths were absolute, or a shipped one) is resolved against the trace's own
folder and each folder above it (the repository it was recorded in), then the working directory;
when none holds it, ``ContractPath.message`` is the one line a report prints instead of silently
leaving out what needed the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdiff.tracer.contract import known

__all__ = ["RELATIVE_TO_ENV", "recorded_path", "ContractPath", "contract_path", "is_model_dir", "same_store"]

#: environment variable: record paths under this directory relative to it (shipped example traces)
RELATIVE_TO_ENV = "SPECDIFF_RECORD_RELATIVE_TO"


def recorded_path(value) -> str:
    """What a recorder writes for a path it was given (``str``; '' for None).

    A local file or directory becomes absolute (``os.path.abspath``: against the working directory,
    symlinks not resolved), or relative to ``$SPECDIFF_RECORD_RELATIVE_TO`` when it lies under that
    directory; a value that names nothing here (a Hugging Face hub id, a URL) is kept as given.
    """
    s = "" if value is None else str(value)
    if not s or "://" in s or not os.path.exists(s):
        return s
    p = os.path.abspath(s)
    root = os.environ.get(RELATIVE_TO_ENV)
    if root:
        rel = os.path.relpath(p, os.path.abspath(root))
        if rel != ".." and not rel.startswith(".." + os.sep):
            return rel
    return p


def same_store(a, b) -> bool:
    """Whether two trace paths name the same store: the same file-system object (``os.path.samefile``:
    relative paths, ``..`` and symlinks followed), or, for a URL, the same string. A path that names
    nothing here is no store (False)."""
    a, b = str(a), str(b)
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def is_model_dir(p: Path) -> bool:
    """A local model directory: it holds config.json."""
    return (p / "config.json").is_file()


@dataclass(frozen=True)
class ContractPath:
    """A contract path fact as read here.

    Attributes:
        fact: the contract field ('model_name', 'draft_name', 'replay_of').
        recorded: its value as recorded (None: absent or unknown).
        path: where it was found here (None: not found, or nothing recorded).
        trace: the trace that recorded it (its path or URL).
    """

    fact: str
    recorded: str | None
    path: Path | None
    trace: str

    @property
    def missing(self) -> bool:
        """A path was recorded but nothing here matches it."""
        return bool(self.recorded) and self.path is None

    def message(self) -> str:
        """One line: which path could not be found, where it was looked for."""
        where = ("" if Path(str(self.recorded)).is_absolute()
                 else " (relative: looked under the trace's folder, each folder above it, and the working directory)")
        return f"{self.fact} {self.recorded} recorded in {self.trace} is not found here{where}"


def _local_dir(trace_path: str) -> Path | None:
    """The folder a local trace lies in (None for a remote URL)."""
    if "://" in trace_path and not trace_path.startswith("file://"):
        return None
    return Path(trace_path.removeprefix("file://")).absolute().parent


def contract_path(trace, fact: str, *, want: Callable[[Path], bool] = Path.exists) -> ContractPath:
    """The path ``trace.contract[fact]`` names, found here (see the module docstring for the order).

    Args:
        trace: an opened trace (``.contract``, ``.path``).
        fact: the contract field.
        want: what the path must be to count as found (default: exists; ``is_model_dir`` for a model).
    """
    value = known(trace.contract, fact)
    recorded = str(value) if value else None
    tpath = str(getattr(trace, "path", ""))
    if recorded is None:
        return ContractPath(fact, None, None, tpath)
    p = Path(recorded).expanduser()
    if p.is_absolute():
        return ContractPath(fact, recorded, p if want(p) else None, tpath)
    base = _local_dir(tpath)
    for d in ([base, *base.parents] if base is not None else []):
        if want(d / p):
            return ContractPath(fact, recorded, d / p, tpath)
    found = p.absolute() if want(p) else None
    return ContractPath(fact, recorded, found, tpath)
