"""Re-run the draft as trained on recorded inputs: the setup the context prover (judge/context_proof.py),
graft and narrow (rerun/) share, read from the diff's ``types.DiffInputs``; it sits below the judges.

Each takes the training trace's draft checkpoint (its contract ``draft_name``, or ``--draft``),
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
from specdiff.replay.diff.align.align import match_rows, rows_by_value
from specdiff.replay.diff.types import DiffInputs
from specdiff.tracer.contract import known
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.paths import contract_path, is_model_dir
from specdiff.tracer.schema import layer_out_name


class RerunError(SpecdiffError):
    """The draft cannot be re-run (no checkpoint, no target, nothing to re-run): one clear line."""


def sides(inputs: DiffInputs) -> tuple[str, str]:
    """(training attr, serving attr) of the diff's Pairs: x/y, swapped when B is the training side."""
    if inputs.labels.y == "training" and inputs.labels.x == "serving":
        return "y", "x"
    return "x", "y"


def checkpoint_dir(train_trace, draft_path, *, error: type[SpecdiffError] = None, command: str = "") -> Path:
    """The draft checkpoint as trained: ``draft_path`` or the training contract's ``draft_name``
    (a relative one found from the trace's folders, ``tracer.paths.contract_path``).

    ``command``: the command line that would pass the checkpoint (``specdiff diff A B``), which a
    missing one's error completes with ``--draft DIR``.

    Raises:
        ``error`` (default RerunError): no checkpoint named, or none found where it is named.
    """
    hint = f"; pass the checkpoint: {command or 'specdiff diff TRAIN SERVE'} --draft DIR"
    if draft_path:
        p = Path(str(draft_path))
        if not is_model_dir(p):
            raise (error or RerunError)(f"draft checkpoint {p} (from --draft DIR) not found (no config.json there)")
        return p
    found = contract_path(train_trace, "draft_name", want=is_model_dir)
    if found.recorded is None:
        raise (error or RerunError)(f"{train_trace.path}: the training trace's contract has no draft_name{hint}")
    if found.path is None:
        raise (error or RerunError)(f"draft checkpoint (the training trace's contract draft_name): "
                                    f"{found.message()}{hint}")
    return found.path


def load_trained_draft(train_trace, draft_path, target_path, dtype, *, error: type[SpecdiffError] = None,
                       command: str = ""):
    """The draft as trained; the target is loaded only when the draft shares its embedding/lm_head
    (``target_path``, else the training contract's ``model_name``). ``command``: as in ``checkpoint_dir``."""
    from specdiff.replay.model.checkpoint import CheckpointError, load_draft
    ddir = checkpoint_dir(train_trace, draft_path, error=error, command=command)
    try:
        loaded = load_draft(ddir, dtype=dtype)
        if loaded.model.embed_source != "random":
            return loaded
    except CheckpointError as e:
        if "lm_head" not in str(e):
            raise
    if target_path:
        tdir, src = Path(str(target_path)), "--target DIR"
        tdir = tdir if is_model_dir(tdir) else None
    else:
        found = contract_path(train_trace, "model_name", want=is_model_dir)
        tdir, src = found.path, "the training trace's contract model_name"
        target_path = found.recorded
    if tdir is None:
        raise (error or RerunError)(f"draft checkpoint {ddir} shares the target's embedding, but the target "
                                    f"{target_path} (from {src}) is not found; pass it: "
                                    f"{command or 'specdiff diff TRAIN SERVE'} --target DIR")
    from specdiff.replay.model.loading import quiet_transformers
    from specdiff.replay.model.target_capture import load_target, target_embedding, target_lm_head
    quiet_transformers()
    target = load_target(tdir)
    return load_draft(ddir, dtype=dtype, target_embedding=target_embedding(target),
                      target_lm_head=target_lm_head(target))


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


def replay_plan(inputs: DiffInputs, tr: str, sv: str) -> list[ReplaySeq]:
    """Every aligned sequence with at least 2 leading positions that have aux rows on both sides.

    A serving request whose prefix hit the radix cache has no aux rows at the cached positions:
    its draft attended there over keys and values the request that first computed the prefix
    wrote (SGLang 0.5.23 shares the draft's KV cache through the same radix tree). Those positions
    are taken from that request's serving rows (``_CachedPrefix``), training's own rows on the
    training side; a request whose prefix no recorded request computed is left out as before.
    """
    m = match_rows(inputs.traces, inputs.alignment, "target.aux_cat")
    out = []
    of_pair = rows_by_value(m.pair)
    prefix = _CachedPrefix(inputs, tr, sv)
    for p in inputs.alignment.seq_pairs:
        sel = of_pair.get(p.index, np.zeros(0, np.int64))
        pos = m.pos[sel]
        rows = {"x": m.rows.x[sel], "y": m.rows.y[sel]}
        head = int(pos[0]) if len(pos) else 0
        if head > 0 and (filled := prefix.rows(p, head)) is not None:
            pos = np.r_[np.arange(head), pos]
            rows = {k: np.r_[filled[k], rows[k]] for k in rows}
        n = int(np.argmax(pos != np.arange(len(pos)))) if (pos != np.arange(len(pos))).any() else len(pos)
        if n < 2:
            continue
        out.append(ReplaySeq(getattr(p.seq, tr), getattr(p.start, tr), n, p.prompt_len, {k: v[:n] for k, v in rows.items()}))
    return out


class _CachedPrefix:
    """Both sides' ``target.aux_cat`` rows of a serving request's radix-cached prefix (replay_plan)."""

    def __init__(self, inputs: DiffInputs, tr: str, sv: str):
        self.traces, self.tr, self.sv, self.index = inputs.traces, tr, sv, {}

    def _rows(self, attr: str) -> dict:
        """seq -> {pos: row} of the side's depth-0 ``target.aux_cat`` rows (read once)."""
        if attr not in self.index:
            k = getattr(self.traces, attr).keys("target.aux_cat", columns=("seq", "pos", "depth"))
            d0 = np.nonzero(k["depth"] == 0)[0]
            by: dict = {}
            for r, sq, ps in zip(d0.tolist(), k["seq"][d0].tolist(), k["pos"][d0].tolist(), strict=True):
                by.setdefault(sq, {}).setdefault(ps, r)  # the first row, as match_rows keeps
            self.index[attr] = by
        return self.index[attr]

    def _tokens(self, seq: int) -> list:
        """Serving sequence ``seq``'s tokens (read once)."""
        key = ("tokens", seq)
        if key not in self.index:
            self.index[key] = list(getattr(self.traces, self.sv).sequence(seq).tokens)
        return self.index[key]

    def rows(self, pair, head: int) -> dict | None:
        """``{"x": rows, "y": rows}`` (int64 [head]) of positions 0..head-1 of ``pair``, or None:
        training's own rows, and serving's from the earliest other serving sequence with the same
        first ``head`` tokens and rows at all of them (the request that computed the prefix)."""
        tr_seq, sv_seq = getattr(pair.seq, self.tr), getattr(pair.seq, self.sv)
        if getattr(pair.start, self.tr) or getattr(pair.start, self.sv):
            return None  # content-paired at an offset: the cached positions are not this pair's
        own = self._rows(self.tr).get(tr_seq, {})
        if any(t not in own for t in range(head)):
            return None
        want = self._tokens(sv_seq)[:head]
        for seq, at in sorted(self._rows(self.sv).items()):
            if seq != sv_seq and all(t in at for t in range(head)) and self._tokens(seq)[:head] == want:
                return {self.tr: np.array([own[t] for t in range(head)], np.int64),
                        self.sv: np.array([at[t] for t in range(head)], np.int64)}
        return None


@dataclass
class Rerun:
    """Everything a re-run needs, read once.

    ``tr`` / ``sv``: the diff's Pair attribute ("x"/"y") of the training / serving trace; ``model``
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


def prepare(inputs: DiffInputs, *, draft_path: str | None, target_path: str | None,
            error: type[SpecdiffError]) -> Rerun:
    """Load the draft as trained and plan a re-run over the diff's aligned sequences.

    Raises:
        ``error``: a side without ``target.aux_cat`` rows, or no sequence with aux rows on both
            sides at its leading positions.
            No draft checkpoint, or a shared-embedding draft without its target: also ``error``.
        CheckpointError: the checkpoint cannot be loaded.
    """
    import torch

    from specdiff.replay.model.loading import DTYPES

    tr, sv = sides(inputs)
    ttrace, strace = getattr(inputs.traces, tr), getattr(inputs.traces, sv)
    for t in (ttrace, strace):
        if "target.aux_cat" not in t.names:
            raise error(f"{t.path}: no target.aux_cat rows; the draft is re-run on recorded aux rows")
    dtype = DTYPES.get(str(known(ttrace.contract, "dtype") or "bfloat16"), torch.bfloat16)
    command = f"specdiff diff {inputs.paths.x} {inputs.paths.y}"  # --draft / --target reach every re-run
    loaded = load_trained_draft(ttrace, draft_path, target_path, dtype, error=error, command=command)
    model, cfg = loaded.model, loaded.config
    plan = replay_plan(inputs, tr, sv)
    if not plan:
        raise error("no aligned sequence has aux rows on both sides at its leading positions")
    ckpt = model.d2t.detach().cpu().clone()
    vd = cfg.draft_vocab_size
    d2t = {k: v if v is not None else ckpt
           for k, v in (("train", recorded_d2t(ttrace, vd)), ("serve", recorded_d2t(strace, vd)))}
    own = {f: bool(getattr(cfg, f)) for f in NORM_FLAGS}
    flags = {"train": norm_flags_of(ttrace.contract, own), "serve": norm_flags_of(strace.contract, own)}
    return Rerun(tr, sv, ttrace, strace, dtype, model, cfg, plan, d2t, flags)


@dataclass
class Batch:
    """The inputs of one re-run over ``seqs`` (ReplaySeq), from both sides.

    Attributes:
        seqs: the sequences, one batch row each.
        ids: "train" / "serve" -> int64 [B, T], each side's tokens x_0..x_{n-1} (and x_n, see
            ``tokens``), right-padded.
        aux: "train" / "serve" -> [B, T, aux_width] ``target.aux_cat`` rows in the run's dtype.
        lengths: int64 [B], each row's ``n``.
        row_of: alignment pair index -> batch row.
        tokens: tokens held per row, on both sides: ``n``, or ``n + 1`` when the sequence has
            x_n (the last aux row's depth-0 draft row reads it: a served sequence's last token
            has no aux row, it was never verified).
    """

    seqs: list
    ids: dict
    aux: dict
    lengths: object
    row_of: dict
    tokens: list

    def coords(self, pair: np.ndarray, pos: np.ndarray, depth: np.ndarray, by_depth: bool) -> tuple:
        """``(b, ok)``: the batch row of each recorded row (int64 [n]) and whether the re-run
        computes it (bool [n]): its pair is in the batch, t < n (an aux row), and, for a by-depth
        stage at depth k, the token x_{t+1+k} it reads is in the batch (``tokens``)."""
        b = np.array([self.row_of.get(int(p), -1) for p in pair], np.int64)
        n = np.array([self.seqs[r].n if r >= 0 else 0 for r in b], np.int64)
        ntok = np.array([self.tokens[r] if r >= 0 else 0 for r in b], np.int64)
        t = pos.astype(np.int64)
        ok = (b >= 0) & (t < n)
        if by_depth:
            ok &= t + 1 + depth.astype(np.int64) < ntok
        return b, ok


def batch_inputs(inputs: DiffInputs, run: Rerun, seqs: list) -> Batch:
    """Both sides' tokens and aux rows of ``seqs`` (ReplaySeq of ``run.plan``) as one batch."""
    import torch

    from specdiff.tracer.store.arrays import to_torch

    traces, cfg = inputs.traces, run.cfg
    side = {"train": run.tr, "serve": run.sv}
    pair_of = {getattr(p.seq, run.tr): p for p in inputs.alignment.seq_pairs}
    toks = []
    for s in seqs:  # x_0..x_n where both sides hold x_n within the pair's common run
        p = pair_of[s.seq_train]
        got = {k: np.asarray(getattr(traces, a).sequence(getattr(p.seq, a)).tokens[
            getattr(p.start, a): getattr(p.start, a) + min(s.n + 1, p.length)], np.int64) for k, a in side.items()}
        toks.append(got)
    B, T = len(seqs), max(max(len(g["train"]), len(g["serve"]), s.n) for g, s in zip(toks, seqs, strict=True))
    ids = {k: torch.zeros(B, T, dtype=torch.int64) for k in side}
    aux = {k: torch.zeros(B, T, cfg.aux_width, dtype=run.dtype) for k in side}
    for r, s in enumerate(seqs):
        for k, attr in side.items():
            t = getattr(traces, attr)
            aux[k][r, : s.n] = to_torch(t.take("target.aux_cat", s.rows[attr]), t.info("target.aux_cat").dtype).to(run.dtype)
            ids[k][r, : len(toks[r][k])] = torch.as_tensor(toks[r][k])
    return Batch(seqs, ids, aux, torch.tensor([s.n for s in seqs], dtype=torch.int64),
                 {pair_of[s.seq_train].index: r for r, s in enumerate(seqs)},
                 [min(len(g["train"]), len(g["serve"])) for g in toks])


#: ``stage_outputs``' name of the re-run's draft logits (no recorded stage: serving keeps only top-K)
LOGITS = "draft.logits"


def stage_outputs(out, d2t, depth: int = 0, name: str | None = None, width: int = 1) -> dict:
    """Tensors [B, T, ...] of one ``ttt_forward`` at draft depth ``depth``, by stage name (fc stages
    have no depth: their depth-0 rows); ids as the recorders pick them (their top-``width`` tie rule,
    ``width`` ids per row, best first). ``name``: only that stage (the ids' top ids over the
    [B, T, Vd] logits are taken only for them)."""
    from specdiff.eagle3.vocab_map import hot_token_ids
    from specdiff.tracer.rows import draft_top_ids

    floats = {"draft.fc_in": lambda: out.fc_in, "draft.fc_out": lambda: out.fc_out,
              "draft.hidden_in": lambda: out.hidden_in[depth], "draft.attn_in": lambda: out.attn_in[depth],
              "draft.hidden_out": lambda: out.hidden_out[depth]}
    for i, h in enumerate(out.layer_out[depth] if out.layer_out else ()):  # a multi-layer draft's earlier layers
        floats[layer_out_name(i)] = lambda h=h: h
    if name in floats:
        return {name: floats[name]()}
    if name == LOGITS:  # the whole logit row [B, T, Vd] (rerun/id_ties.py judges ids by it)
        return {name: out.logits[depth].float()}
    top1 = draft_top_ids(out.logits[depth].float(), width)
    ids = {"draft.logits_topk.ids": top1, "draft.topk": top1, "draft.topk_target": hot_token_ids(d2t)[top1]}
    if name in ids:
        return {name: ids[name]}
    return {**{k: f() for k, f in floats.items()}, **ids}


def computed_rows(out, d2t, name: str, b: np.ndarray, t: np.ndarray, depth: np.ndarray,
                  width: int = 1) -> np.ndarray:
    """The re-run's value of stage ``name`` at each (batch row ``b``, position ``t``, depth), as
    float32 [n, ...] in the order given (rows of several depths gathered depth by depth); id
    stages: ``width`` ids per row (``stage_outputs``)."""
    import torch

    vals = None
    for d in sorted(set(depth.tolist())):
        sel = np.nonzero(depth == d)[0]
        got = stage_outputs(out, d2t, int(d), name, width)[name][torch.as_tensor(b[sel]), torch.as_tensor(t[sel])]
        got = got.detach().float().cpu().numpy()
        if vals is None:
            vals = np.zeros((len(b),) + got.shape[1:], np.float32)
        vals[sel] = got
    return vals if vals is not None else np.zeros((0,), np.float32)  # no rows: shape (0,)
