"""Export the selected slice: both sides' rows of the selected sequence, plus the cell's metrics.

Writes a new ``<dir>/specdiff-export-<tensor>-seq<S>-pos<P>-depth<D>/`` holding ``a.trace`` and ``b.trace`` (small
specdiff traces, one per side, readable with ``open_trace`` and diffable with ``specdiff diff``)
and ``metrics.json`` (the cell's and the tensor's numbers from the report).

Each trace keeps *every* tensor's rows of that sequence (and the rows of no sequence: the vocab
map), not only the selected tensor's: the explanation of a divergence reads other tensors as its
evidence (the training side's ``target.probe.*`` say which HF layer serving captured, the other
aux slots, the inputs a stage inherits from), so a slice of the selected tensor alone re-diffed
said "no known mistake's transform closes the gap" where the full pair named the shifted layer ids.
One sequence of every tensor is still small.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from specdiff.replay.diff.result import json_safe
from specdiff.tracer.store import TraceWriter
from specdiff.tracer.store.arrays import to_torch
from specdiff.tui.view import CELLS, Sel, ViewModel


def _new_folder(root: Path, name: str) -> Path:
    """Create and return ``root/name``, or ``root/name-2``, ``-3``, ... when taken (mkdir without
    exist_ok claims the name atomically, so two exports never share a folder)."""
    for k in range(1, 10_000):
        out = root / (name if k == 1 else f"{name}-{k}")
        try:
            out.mkdir()
            return out
        except FileExistsError:
            continue
    raise OSError(f"{root}: 9999 exports named {name} already; choose another folder")


def export_slice(vm: ViewModel, sel: Sel, *, root: str | Path = ".",
                 progress: Callable[[int, int], None] | None = None) -> Path:
    """Write a new export folder for ``sel`` under ``root`` (created if missing); returns its path.

    The folder is ``specdiff-export-<tensor>-seq<S>-pos<P>-depth<D>``, with ``-2``, ``-3``, ... added
    when that name exists: an export never replaces an earlier one. It appears whole or not at
    all: written as ``.<name>.partial-<pid>`` beside it and renamed onto the (empty) folder claimed
    for it; a failure or an interrupt removes both. ``progress(done, total)`` is called after each
    tensor of each side is written (``total``: both sides' tensor count).

    Raises:
        OSError: ``root`` cannot be created or written.
    """
    Path(root).mkdir(parents=True, exist_ok=True)
    final = _new_folder(Path(root), f"specdiff-export-{sel.name}-seq{sel.pair}-pos{sel.pos}-depth{sel.depth}")
    out = final.with_name(f".{final.name}.partial-{os.getpid()}")
    try:
        out.mkdir()
        _write_slice(vm, sel, out, progress)
        out.replace(final)  # onto the empty claimed folder: one rename (POSIX)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        if final.is_dir() and not any(final.iterdir()):
            final.rmdir()
        raise
    return final


def _write_slice(vm: ViewModel, sel: Sel, out: Path, progress: Callable[[int, int], None] | None) -> None:
    """``export_slice``'s files (``a.trace``, ``b.trace``, ``metrics.json``) into the empty folder ``out``."""
    r = vm.report
    pair = vm.pairs[sel.pair]
    total, done = len(r.traces.x.names) + len(r.traces.y.names), 0
    for trace, sid, fname in ((r.traces.x, pair.seq.x, "a.trace"), (r.traces.y, pair.seq.y, "b.trace")):
        # recorder_caught_up_at: the live writer's progress, not a fact of the closed slice (FORMAT.md)
        contract = {k: v for k, v in trace.contract.items() if k not in ("side", "recorder_caught_up_at")}
        with TraceWriter(str(out / fname), side=trace.side, contract=contract) as w:
            seq = trace.sequence(sid)
            new = w.add_sequence(seq.tokens[: pair.length], prompt_len=min(seq.prompt_len, pair.length),
                                 rid=seq.rid)
            for name in trace.names:
                keys = trace.keys(name)
                own = keys["seq"] == sid
                rows = np.nonzero((own & (keys["pos"] < pair.length)) | (keys["seq"] < 0))[0]
                if len(rows):
                    data = to_torch(trace.take(name, rows), trace.info(name).dtype)
                    w.append(name, data, seq=np.where(own[rows], new, keys["seq"][rows]), pos=keys["pos"][rows],
                             depth=keys["depth"][rows], iter=keys["iter"][rows])
                done += 1
                if progress is not None:
                    progress(done, total)
    code, i = vm.cell(sel)
    comp = r.comparisons.get(sel.name)
    cell = {"status": CELLS[code][2]}
    if comp is not None and i >= 0:
        cell.update(score=float(comp.score[i]), cos=float(comp.cos[i]), nonfinite=bool(comp.nonfinite[i]),
                    rows=[_trace_row(r.traces.x, sel.name, int(comp.match.rows.x[i])),
                          _trace_row(r.traces.y, sel.name, int(comp.match.rows.y[i]))])
    metrics = {
        "tensor": sel.name, "seq": sel.pair, "pos": sel.pos, "depth": sel.depth,
        "sequence_ids": [pair.seq.x, pair.seq.y], "labels": [r.labels.x, r.labels.y],
        "traces": [str(r.paths.x), str(r.paths.y)], "files": ["a.trace", "b.trace"],
        "verdict": r.verdict(), "cell": cell,
        "tensor_stats": comp.stats if comp is not None else None,
        "tolerance": asdict(comp.tolerance) if comp is not None else None,
        "worst": comp.worst if comp is not None else None,
    }
    (out / "metrics.json").write_text(json.dumps(json_safe(metrics), indent=2))


def _trace_row(trace, name: str, row: int) -> int:
    """``row`` of ``name`` as a row of the trace on disk: a watch diff reads one request's rows
    through a ``tracer.store.selection.Selection`` (its own row numbers; ``base_rows`` maps them)."""
    base_rows = getattr(trace, "base_rows", None)
    return int(base_rows[name][row]) if base_rows is not None and name in base_rows else row
