"""Re-run the draft as trained on recorded inputs: the setup graft and narrow share.

Both take the training trace's draft checkpoint (its contract ``draft_name``, or ``--draft``),
the aligned sequences with aux rows on both sides, each side's vocab map (``draft.d2t`` rows) and
norm flags (contract), and re-run ``Eagle3Draft.ttt_forward`` with inputs taken from one side or
the other. This module owns that setup (``prepare``); graft ranks substitutions by accept length,
narrow compares each re-run with what serving's draft computed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdiff.eagle3.norms import NORM_FLAGS
from specdiff.replay.diff.align import match_rows, rows_by_value
from specdiff.tracer.contract import known
from specdiff.tracer.errors import SpecdiffError


class RerunError(SpecdiffError):
    """The draft cannot be re-run (no checkpoint, no target, nothing to re-run): one clear line."""


def sides(report) -> tuple[str, str]:
    """(training attr, serving attr) of the report's Pair: x/y, swapped when B is the training side."""
    if report.labels.y == "training" and report.labels.x == "serving":
        return "y", "x"
    return "x", "y"


def checkpoint_dir(train_trace, draft_path, *, error: type[SpecdiffError] = None) -> Path:
    """The draft checkpoint as trained: ``draft_path`` or the training contract's ``draft_name``."""
    src = "--draft DIR" if draft_path else "the training trace's contract draft_name"
    path = draft_path or known(train_trace.contract, "draft_name")
    if not path:
        raise (error or RerunError)(f"{train_trace.path}: the training trace's contract has no draft_name; pass the "
                         "draft checkpoint with --draft DIR (graft(draft_path=...))")
    p = Path(str(path))
    if not (p / "config.json").is_file():
        hint = "" if draft_path else "; pass the checkpoint with --draft DIR (graft(draft_path=...))"
        raise (error or RerunError)(f"draft checkpoint {p} (from {src}) not found (no config.json there){hint}")
    return p


def load_trained_draft(train_trace, draft_path, target_path, dtype, *, error: type[SpecdiffError] = None):
    """The draft as trained; the target is loaded only when the draft shares its embedding/lm_head."""
    from specdiff.replay.model.checkpoint import CheckpointError, load_draft
    ddir = checkpoint_dir(train_trace, draft_path, error=error)
    try:
        loaded = load_draft(ddir, dtype=dtype)
        if loaded.model.embed_source != "random":
            return loaded
    except CheckpointError as e:
        if "lm_head" not in str(e):
            raise
    tpath = target_path or known(train_trace.contract, "model_name")
    src = "--target DIR" if target_path else "the training trace's contract model_name"
    if not tpath or not (Path(str(tpath)) / "config.json").is_file():
        raise (error or RerunError)(f"draft checkpoint {ddir} shares the target's embedding, but the target {tpath} "
                         f"(from {src}) is not found; pass it with --target DIR (graft(target_path=...))")
    from specdiff.replay.model.target_capture import load_target, target_embedding, target_lm_head
    from specdiff.replay.record.record_train import _quiet_transformers
    _quiet_transformers()
    target = load_target(Path(str(tpath)))
    return load_draft(ddir, dtype=dtype, target_embedding=target_embedding(target).float(),
                      target_lm_head=target_lm_head(target).float())


def recorded_d2t(trace, vd: int):
    """The vocab map a trace recorded (``draft.d2t`` rows, pos = draft id), or None."""
    import torch
    if "draft.d2t" not in trace.names:
        return None
    pos = trace.keys("draft.d2t")["pos"]
    vals = trace.read("draft.d2t").reshape(-1)
    if len(vals) != vd or set(pos.tolist()) != set(range(vd)):
        return None
    out = np.empty(vd, np.int64)
    out[pos] = vals
    return torch.as_tensor(out)


def norm_flags_of(contract: dict, default: dict) -> dict:
    """The norm flags a trace's contract states; ``default`` (the checkpoint's own) where unknown."""
    return {f: bool(known(contract, f)) if known(contract, f) is not None else default[f] for f in NORM_FLAGS}


@contextlib.contextmanager
def with_norm_flags(model, flags: dict):
    """Temporarily run ``model`` with other norm flags (a missing input_norm / fc_norm gets unit weights)."""
    from specdiff.replay.model.draft_model import RMSNorm
    c = model.config
    saved = {f: getattr(c, f) for f in NORM_FLAGS}
    mods = (model.input_norm, model.fc_norm)
    try:
        for f, v in flags.items():
            setattr(c, f, v)
        dt, dev = model.fc.weight.dtype, model.fc.weight.device
        if not flags["norm_before_fc"]:
            model.input_norm = None
        elif model.input_norm is None:
            model.input_norm = RMSNorm(c.aux_width, c.rms_norm_eps).to(dev, dt)
        if not flags["fc_norm"]:
            model.fc_norm = None
        elif model.fc_norm is None:
            import torch
            model.fc_norm = torch.nn.ModuleList(RMSNorm(c.target_hidden_size, c.rms_norm_eps)
                                                for _ in range(c.num_aux)).to(dev, dt)
        yield model
    finally:
        for f, v in saved.items():
            setattr(c, f, v)
        model.input_norm, model.fc_norm = mods


@dataclass
class ReplaySeq:
    """One aligned sequence to re-run: its leading ``n`` positions with aux rows on both sides."""

    seq_train: int
    start: int  # the common part's first token on the training side (content-paired sequences)
    n: int  # leading positions with aux rows on both sides
    prompt_len: int
    rows: dict  # side attr -> aux_cat row indices [n]


def replay_plan(report, tr: str, sv: str) -> list[ReplaySeq]:
    """Every aligned sequence with at least 2 leading positions that have aux rows on both sides."""
    m = match_rows(report.traces, report.alignment, "target.aux_cat")
    out = []
    of_pair = rows_by_value(m.pair)
    for p in report.alignment.seq_pairs:
        sel = of_pair.get(p.index, np.zeros(0, np.int64))
        pos = m.pos[sel]
        n = int(np.argmax(pos != np.arange(len(pos)))) if (pos != np.arange(len(pos))).any() else len(pos)
        if n < 2:
            continue
        rows = {"x": m.rows.x[sel][:n], "y": m.rows.y[sel][:n]}
        out.append(ReplaySeq(getattr(p.seq, tr), getattr(p.start, tr), n, p.prompt_len, rows))
    return out


@dataclass
class Rerun:
    """Everything a re-run needs, read once.

    ``tr`` / ``sv``: the report Pair attribute ("x"/"y") of the training / serving trace; ``model``
    the draft as trained (``Eagle3Draft``, ``dtype``); ``plan`` the sequences to re-run; ``d2t`` and
    ``flags``: each side's vocab map (int64 [Vd]; the checkpoint's where a side recorded none) and
    norm flags, keyed "train" / "serve".
    """

    tr: str
    sv: str
    ttrace: object
    strace: object
    dtype: object
    model: object
    cfg: object
    plan: list
    d2t: dict
    flags: dict


def prepare(report, *, draft_path: str | None, target_path: str | None, error: type[SpecdiffError]) -> Rerun:
    """Load the draft as trained and plan a re-run over the report's aligned sequences.

    Raises:
        ``error``: a side without ``target.aux_cat`` rows, or no sequence with aux rows on both
            sides at its leading positions.
            No draft checkpoint, or a shared-embedding draft without its target: also ``error``.
        CheckpointError: the checkpoint cannot be loaded.
    """
    import torch

    from specdiff.replay.record.record_train import DTYPES

    tr, sv = sides(report)
    ttrace, strace = getattr(report.traces, tr), getattr(report.traces, sv)
    for t in (ttrace, strace):
        if "target.aux_cat" not in t.names:
            raise error(f"{t.path}: no target.aux_cat rows; the draft is re-run on recorded aux rows")
    dtype = DTYPES.get(str(known(ttrace.contract, "dtype") or "bfloat16"), torch.bfloat16)
    loaded = load_trained_draft(ttrace, draft_path, target_path, dtype, error=error)
    model, cfg = loaded.model, loaded.config
    plan = replay_plan(report, tr, sv)
    if not plan:
        raise error("no aligned sequence has aux rows on both sides at its leading positions")
    ckpt = model.d2t.detach().cpu().clone()
    vd = cfg.draft_vocab_size
    d2t = {k: v if v is not None else ckpt
           for k, v in (("train", recorded_d2t(ttrace, vd)), ("serve", recorded_d2t(strace, vd)))}
    own = {f: bool(getattr(cfg, f)) for f in NORM_FLAGS}
    flags = {"train": norm_flags_of(ttrace.contract, own), "serve": norm_flags_of(strace.contract, own)}
    return Rerun(tr, sv, ttrace, strace, dtype, model, cfg, plan, d2t, flags)
