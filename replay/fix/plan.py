"""Cause -> fix plan: what to change in a copy of the served draft so that serving computes what
training did, or the one line saying why no mechanical fix exists.

The cause is the report's first explanation at its first divergence (replay/diff/causes.py ids). The
mechanical fixes (``PLANNERS``), each read from the two traces' contracts and the served checkpoint:

- ``aux_layer_shift`` / ``aux_ids_default`` / ``aux_layer_count``: the aux ids that make the serving
  engine capture the training side's HF layers, in that engine's numbering for the target and its
  config key (explain/aux.py ``aux_fix``, the same ids the explanation's fix names);
- ``aux_slot_permutation``: fc.weight's column blocks (and ``input_norm`` / ``fc_norm.{j}``) rewritten
  from the training concat order to the serving one (eagle3/fc_blocks.py);
- ``d2t_direct_ids`` / ``d2t_missing`` / ``d2t_arange`` / ``d2t_other_map``: the d2t offsets the
  training side recorded (``draft.d2t``; for direct ids without it, ``d2t - arange``), and ``t2d``
  rebuilt from them (eagle3/vocab_map.py);
- ``norm_before_fc``: the norm flags the training contract records, written at every key the
  engine reads (eagle3/norms.py ``NORM_FLAGS``), and the norm weights the flags no longer use removed;
- server options (``OPTION_PLANNERS``): the draft window training computed
  (``--speculative-draft-window-size``, or none), ``--speculative-algorithm EAGLE3``, and the training
  dtype for an fp16 overflow; SGLang only (the draft copy is unchanged).

Everything else is refused (``NoMechanicalFix``): an engine crash, a cause in another model's
weights, a fix that needs the trained weights, a legitimate difference, an unexplained divergence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdiff.eagle3.config_keys import config_value
from specdiff.eagle3.engines import REGISTRY
from specdiff.eagle3.norms import NORM_FLAGS, read_norm_flags
from specdiff.replay.diff.causes import cause_row
from specdiff.replay.diff.explain.aux import aux_fix
from specdiff.tracer.contract import aux_slot_layers, known
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.paths import contract_path, is_model_dir

__all__ = ["ConfigEdit", "FixPlan", "NoMechanicalFix", "OptionEdit", "TensorEdit", "plan_fix", "PLANNERS",
           "OPTION_PLANNERS", "apply_options"]


class NoMechanicalFix(SpecdiffError):
    """No copy of the served draft would fix this divergence; the message is the one line why."""


@dataclass(frozen=True)
class ConfigEdit:
    """One config.json key to change: ``key`` as eagle3/config_keys.py names keys ('a.b' nested,
    'top-level x' or 'x' at the top), its served value ``old`` (None: absent) and ``new``."""

    key: str
    old: object
    new: object


@dataclass(frozen=True)
class TensorEdit:
    """One checkpoint tensor to write (``new``: a torch tensor, its dtype the served one's) or remove
    (``new`` None); ``why``: what the change is, in words."""

    name: str
    new: object
    why: str


@dataclass(frozen=True)
class OptionEdit:
    """One serving engine option to change: ``flag`` as given on the command line
    (``--speculative-draft-window-size``), the value the recorded server had (``old``: None when not given)
    and the one to serve with (``new``: None drops the flag, True gives it bare)."""

    flag: str
    old: object
    new: object

    def argv(self) -> list[str]:
        """The flag as command-line words (``[]`` when dropped)."""
        if self.new is None or self.new is False:
            return []
        return [self.flag] if self.new is True else [self.flag, str(self.new)]


def apply_options(argv: list[str], edits) -> list[str]:
    """``argv`` (SGLang flags, each flag followed by its value unless bare) with ``edits`` (``OptionEdit``)
    applied: every occurrence of an edited flag and its value removed, then the new words appended."""
    flags = {e.flag for e in edits}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in flags:
            i += 1 + (i + 1 < len(argv) and not argv[i + 1].startswith("--"))
            continue
        out.append(argv[i])
        i += 1
    for e in edits:
        out += e.argv()
    return out


@dataclass(frozen=True)
class FixPlan:
    """What ``specdiff fix`` writes.

    Attributes:
        cause: the cause id fixed (replay/diff/causes.py).
        tensor: the first divergence's tensor.
        fix: the explanation's fix sentence.
        source: the served draft directory (the serving contract's ``draft_name``), copied, never edited.
        config: config.json edits, in order.
        tensors: safetensors edits, in order.
        options: serving engine options to change (the copy of the draft is then unchanged), in order.
    """

    cause: str
    tensor: str | None
    fix: str
    source: Path
    config: tuple[ConfigEdit, ...] = ()
    tensors: tuple[TensorEdit, ...] = ()
    options: tuple[OptionEdit, ...] = ()


@dataclass
class _Sides:
    """What a planner reads: both traces, the served draft's folder and config.json dict."""

    train: object
    serve: object
    source: Path
    raw: dict

    def weight(self, name: str):
        """The served checkpoint's tensor ``name`` (torch, its stored dtype), or None."""
        from safetensors import safe_open

        for f in sorted(self.source.glob("*.safetensors")):
            with safe_open(str(f), "pt") as h:
                if name in h.keys():
                    return h.get_tensor(name)
        return None


def plan_fix(report) -> FixPlan | None:
    """The fix of ``report``'s (replay/diff/result.py ``DiffReport``) first divergence; None when
    nothing diverged.

    Raises:
        NoMechanicalFix: an engine crash, no serving or no training side, no explanation, a cause with
            no mechanical fix, or the served draft directory not found here (one line each).
    """
    if not report.diverged:
        return None
    if report.crash is not None:
        cause = report.crash.get("cause")
        cause = cause.get("message", cause) if isinstance(cause, dict) else cause or report.crash.get("message")
        raise NoMechanicalFix(f"no mechanical fix: the {report.crash.get('label', 'serving')} engine crashed "
                              f"({cause}); fix the setup the report names, then serve and record again")
    traces = report.traces
    if {traces.x.side, traces.y.side} != {"train", "serve"}:
        raise NoMechanicalFix(f"no mechanical fix: fix needs a training trace and a serving trace, got "
                              f"{traces.x.side} and {traces.y.side}")
    train, serve = (traces.x, traces.y) if traces.x.side == "train" else (traces.y, traces.x)
    first = report.first.name if report.first is not None else None
    named = [e for e in report.explanations if not e.named_only]
    if not named:  # a recorded fact that differs at the stage, named not proven, whose fix is a server option:
        # written all the same (``--verify`` re-serves with it and proves it, or shows the next divergence)
        named = [e for e in report.explanations if e.named_only and e.cause in OPTION_PLANNERS]
    if not named:
        raise NoMechanicalFix(f"no mechanical fix: nothing explains the first divergence at {first} "
                              "(`specdiff diff` shows the evidence and the narrowing)")
    e = named[0]
    row = cause_row(e.cause)
    planner = PLANNERS.get(e.cause)
    options = OPTION_PLANNERS.get(e.cause)
    if planner is None and options is None:
        why = row.no_fix or (f"a {row.kind} difference: {row.meaning}" if row.kind != "bug"
                                       else row.meaning)
        raise NoMechanicalFix(f"no mechanical fix for {e.cause} at {first}: {why}")
    found = contract_path(serve, "draft_name", want=is_model_dir)
    if found.path is None:
        raise NoMechanicalFix("no mechanical fix: " + (found.message() if found.recorded else
                                                       "the serving trace records no draft_name"))
    raw = json.loads((found.path / "config.json").read_text())
    sides = _Sides(train, serve, found.path, raw)
    if options is not None:
        return FixPlan(e.cause, first, e.fix, found.path, options=tuple(options(sides, e)))
    config, tensors = planner(sides, e)
    return FixPlan(e.cause, first, e.fix, found.path, tuple(config), tuple(tensors))


def _aux_ids(s: _Sides, e) -> tuple[list, list]:
    """The training side's HF layers in the serving engine's ids and key (explain/aux.py ``aux_fix``)."""
    hf = aux_slot_layers(s.train.contract)
    if not hf:
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the training trace records no aux layers")
    fix = aux_fix(list(hf), s.serve, s.train)
    if fix.ids is None:
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: {fix.text}")
    return [ConfigEdit(fix.key, config_value(s.raw, fix.key), list(fix.ids))], []


def _aux_permutation(s: _Sides, e) -> tuple[list, list]:
    """fc.weight's column blocks (and the norms before fc) from the training concat order to the serving one."""
    from specdiff.eagle3.fc_blocks import reorder_fc_blocks

    order = [known(t.contract, "aux_concat_order") or aux_slot_layers(t.contract) for t in (s.train, s.serve)]
    if not all(order) or sorted(order[0]) != sorted(order[1]):
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the traces do not record both concat orders "
                              f"of the same layers (training {order[0]}, serving {order[1]})")
    why = f"column blocks from the training concat order HF {list(order[0])} to serving's HF {list(order[1])}"
    edits = []
    for name in ("fc.weight", "input_norm.weight"):
        w = s.weight(name)
        if w is not None:
            edits.append(TensorEdit(name, reorder_fc_blocks(w, from_order=order[0], to_order=order[1]), why))
    if not edits:
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the served checkpoint holds no fc.weight")
    slots = [s.weight(f"fc_norm.{j}.weight") for j in range(len(order[0]))]
    if all(w is not None for w in slots):
        for j, hf in enumerate(order[1]):
            edits.append(TensorEdit(f"fc_norm.{j}.weight", slots[list(order[0]).index(hf)],
                                    f"the norm of HF {hf}, trained as slot {list(order[0]).index(hf)}"))
    return [], edits


def _d2t(s: _Sides, e) -> tuple[list, list]:
    """The training side's d2t offsets (and t2d rebuilt from them) in place of the served map."""
    import torch

    from specdiff.eagle3.vocab_map import d2t_from_target_ids, t2d_from_d2t

    served = s.weight("d2t")
    if "draft.d2t" in s.train.names:
        d2t = np.asarray(s.train.read("draft.d2t")).reshape(-1).astype(np.int64)
        why = "the training side's offsets (draft.d2t of the training trace)"
    elif e.cause == "d2t_direct_ids" and served is not None:
        d2t = d2t_from_target_ids(served).numpy()
        why = "direct target ids made offsets: d2t - arange"
    else:
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: it needs the trained draft's d2t, which the training "
                              "trace did not record")
    ar = np.arange(len(d2t))
    if not d2t.any() or np.array_equal(d2t, ar):
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the training side's own d2t is "
                              f"{'all zeros' if not d2t.any() else 'arange'}, no vocab map to write")
    vd = s.raw.get("draft_vocab_size")
    if vd is not None and int(vd) != len(d2t):
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the training d2t maps {len(d2t)} draft ids, the served "
                              f"config's draft_vocab_size is {vd}")
    dtype = served.dtype if served is not None else torch.int64
    edits = [TensorEdit("d2t", torch.from_numpy(d2t).to(dtype), why)]
    vocab = s.raw.get("vocab_size") or known(s.serve.contract, "vocab_size")
    if vocab:
        t2d = torch.from_numpy(t2d_from_d2t(d2t, int(vocab)))
        old = s.weight("t2d")
        if old is None or not torch.equal(old.to(torch.bool), t2d):
            edits.append(TensorEdit("t2d", t2d.to(old.dtype if old is not None else torch.bool),
                                    "the target ids the new d2t reaches"))
    return [], edits


#: norm flag -> the checkpoint tensors it uses (eagle3/norms.py ``NormFlag.weights``)
_NORM_WEIGHTS = {"norm_before_fc": lambda k: ["input_norm.weight"],
                 "fc_norm": lambda k: [f"fc_norm.{j}.weight" for j in range(k)]}


def _norms(s: _Sides, e) -> tuple[list, list]:
    """The training contract's norm flags, at every key of the served config the engine reads."""
    from specdiff.replay.model.draft_config import detect_format

    fmt = detect_format(s.raw)
    served = read_norm_flags(s.raw, fmt)
    # fc.weight [Hd, K*H] (H the target's hidden size): the served checkpoint says how many aux slots it concatenates
    fc, h = s.weight("fc.weight"), s.raw.get("target_hidden_size") or s.raw.get("hidden_size")
    k = len(aux_slot_layers(s.train.contract) or []) or (
        fc.shape[1] // int(h) if fc is not None and fc.ndim == 2 and h else 0)
    if not k:
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: neither the training contract's aux layers nor the "
                              "served fc.weight say how many aux slots the norm weights cover")
    config, tensors = [], []
    for name, weights in _NORM_WEIGHTS.items():
        want = known(s.train.contract, name)
        if not isinstance(want, bool) or want == served[name][0]:
            continue
        keys = [key for key in NORM_FLAGS[name].keys[fmt] if _present(s.raw, key)] or [name]
        config += [ConfigEdit(key, config_value(s.raw, key), want) for key in keys]
        for w in weights(k):
            held = s.weight(w) is not None
            if want and not held:
                raise NoMechanicalFix(f"no mechanical fix for {e.cause}: training applied {name}, whose {w} is a "
                                      "trained weight the served checkpoint does not hold")
            if not want and held:
                tensors.append(TensorEdit(w, None, f"unused once {name} is off, as trained"))
    if not config:
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the served config's norm flags already are the "
                              "training contract's")
    return config, tensors


def _present(raw: dict, key: str) -> bool:
    head, _, tail = key.partition(".")
    return head in raw if not tail else isinstance(raw.get(head), dict) and tail in raw[head]


def _given(serve, name: str):
    """The value the operator gave the recorded server for option ``name`` (contract
    ``engine_options_given``), or None."""
    entry = (known(serve.contract, "engine_options_given") or {}).get(name)
    return entry.get("value") if isinstance(entry, dict) else None


def _offered(s: _Sides, e, option: str) -> None:
    """Raises NoMechanicalFix unless the serving engine offers ``option`` for a fix (its
    eagle3/engines.py ``EngineSpec.fix_options``)."""
    engine = known(s.serve.contract, "engine")
    if option not in getattr(REGISTRY.get(str(engine)), "fix_options", ()):
        owners = " / ".join(spec.title for spec in REGISTRY.values() if option in spec.fix_options)
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the option it needs is {owners}'s; the serving trace "
                              f"was recorded on {engine}")


def _window_option(s: _Sides, e) -> list[OptionEdit]:
    """The draft window training computed, as SGLang 0.5.23's one option for it:
    ``--speculative-draft-window-size W`` (every draft layer, counted over the KV sequence that holds the
    step's draft tokens: llama_eagle3.py:286-299, eagle3/attention_window.py ``KV``), or none."""
    from specdiff.eagle3.attention_window import KV

    _offered(s, e, "--speculative-draft-window-size")
    windows = known(s.train.contract, "draft_attention_window")
    if not isinstance(windows, list) or not windows:
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the training trace records no draft attention window")
    old = _given(s.serve, "speculative_draft_window_size")
    if all(w is None for w in windows):
        return [OptionEdit("--speculative-draft-window-size", old, None)]
    sizes = {(w.get("window"), w.get("distance")) if isinstance(w, dict) else None for w in windows}
    if len(sizes) == 1 and next(iter(sizes)) is not None and next(iter(sizes))[1] == KV:
        return [OptionEdit("--speculative-draft-window-size", old, next(iter(sizes))[0])]
    raise NoMechanicalFix(f"no mechanical fix for {e.cause}: training's windows {windows} are not one window counted "
                          "over the KV sequence on every layer, the only one SGLang 0.5.23 serves "
                          "(--speculative-draft-window-size; llama_eagle3.py:286-299)")


def _algorithm_option(s: _Sides, e) -> list[OptionEdit]:
    """Serve the EAGLE-3 draft as EAGLE3 (SGLang then feeds it the aux hidden states)."""
    _offered(s, e, "--speculative-algorithm")
    return [OptionEdit("--speculative-algorithm", known(s.serve.contract, "spec_algorithm"), "EAGLE3")]


def _dtype_option(s: _Sides, e) -> list[OptionEdit]:
    """Serve in the dtype training computed in (an fp16 overflow is bf16's range away)."""
    _offered(s, e, "--dtype")
    want = known(s.train.contract, "dtype")
    if want is None:  # never a default: the dtype served is the one training recorded computing in
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: the training trace records no dtype to serve in")
    want = str(want).removeprefix("torch.")
    if want == "float16":
        raise NoMechanicalFix(f"no mechanical fix for {e.cause}: training computed in float16 too")
    return [OptionEdit("--dtype", _given(s.serve, "dtype"), want)]


#: cause id -> planner(sides, explanation) -> (config edits, tensor edits)
PLANNERS = {
    "aux_layer_shift": _aux_ids, "aux_ids_default": _aux_ids, "aux_layer_count": _aux_ids,
    "aux_slot_permutation": _aux_permutation,
    "d2t_direct_ids": _d2t, "d2t_missing": _d2t, "d2t_arange": _d2t, "d2t_other_map": _d2t,
    "norm_before_fc": _norms,
}

#: cause id -> planner(sides, explanation) -> serving option edits (the draft copy stays as served)
OPTION_PLANNERS = {
    "contract.draft_attention_window": _window_option,
    "speculative_algorithm": _algorithm_option,
    "fp16_overflow": _dtype_option,
}
