"""The training side's noise floor per stage: its own forward re-run at the other precision.

A correct pair differs only by rounding: serving and training are two bf16 approximations of one
float32 computation, so their per-row difference at a stage is of the size of one side's bf16 vs
float32 gap there (measured: SGLang 0.5.23's bf16 aux rows on a CPU, tiny 8-layer target, vs HF
bf16 3-4e-3, vs HF fp32 5-6e-3). A fixed tolerance (rel 0.05) cannot see a difference that is
systematic but small: a target with other decoder weights moved every aux row to about twice the
pair's noise and passed.
This module measures the floor the diff judges such a shift against
(replay/diff/judge/shift.py): ``record train`` re-runs its forward on a few of its sequences with
target and draft in float32 when it recorded in bf16 or fp16 (in bf16 when it recorded in float32),
and records per float tensor the median and 90th percentile of the per-row relative error between
the two runs (the diff's own metric, eagle3/row_error.py).

No second copy of a model is made (``at_other_precision``, on replay/model/other_precision.py): the floating
tensors are cast in place for the re-run and their very originals put back after (same storage, no rounding),
so the trace's models are bit for bit what they were. A transformers target, whose modules each read only their
own tensors in their forward, is cast one module at a time (``cast_by_module``): its peak is the model plus its
largest module at the other precision, not a float32 copy of the whole model (benchmarks/production_train.py, a
Llama-3-8B shape narrowed to 2048 wide, 1.56 GiB of checkpoints: record train peaked at 7.34 GiB with copies,
5.60 GiB cast in place; at 4096 wide the copies, 9.9 GiB, did not fit in half the free memory of a 24 GiB
machine and the floor went unmeasured). The draft (its forward reads its fc's dtype outside fc's own forward:
replay/model/draft_model.py ``fc_input``) is cast whole (``cast_whole``), but for an embedding read only by its
lookup, whose output is cast instead (bit for bit the same rows, without the table at float32). A target that
holds its states (stored features, an engine: ``capture_batch``) is not cast: its states are read, not computed
here, so the draft's inputs are the same at either precision, and its own ``target.*`` stages are left out of
the floor (``without_target_floor``); casting it held its lm_head at float32 for nothing (4.4 GiB at the
Kimi-K2 width, which left the draft's floor of a features trace unmeasured there). The values are those of
float32 copies of both models (tests/replay/record/test_noise_floor_copy.py compares them).

When the cast tensors do not fit in the memory the forward runs in (half of what is free), or a
model's tensors cannot be cast, the floor is recorded as not measured, with the reason.
"""

from __future__ import annotations

import copy
from contextlib import ExitStack, contextmanager

import numpy as np
import torch

from specdiff.eagle3.acceptance import AcceptTally
from specdiff.eagle3.row_error import relative_error
from specdiff.replay.model.other_precision import (
    CastError,
    cast_by_module,
    cast_whole,
    largest_module_bytes,
    other_dtype,
    whole_cast_bytes,
)
from specdiff.tracer.schema import spec_for

__all__ = ["FLOOR_TOKENS", "at_other_precision", "measure_noise_floor", "probe_sequences", "without_target_floor"]

#: tokens the re-run covers (whole sequences, at least one): enough rows for a stable median of every
#: stage (a sequence of T tokens gives T rows per aux slot and about T per draft depth)
FLOOR_TOKENS = 256
#: at most this many sequences in the re-run's one padded batch
FLOOR_SEQUENCES = 4


def probe_sequences(lengths: list[int], *, tokens: int = FLOOR_TOKENS, most: int = FLOOR_SEQUENCES) -> list[int]:
    """Indexes of the sequences the re-run takes: the first ones, in order, until ``tokens`` tokens
    or ``most`` sequences (at least one when there is any)."""
    picked, total = [], 0
    for i, n in enumerate(lengths):
        if len(picked) >= most or (picked and total >= tokens):
            break
        picked.append(i)
        total += n
    return picked


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def _holds_states(target) -> bool:
    """A target whose states are read, not computed here (stored features, an engine: ``capture_batch``)."""
    return hasattr(target, "capture_batch")


def _by_module(target) -> bool:
    """A transformers target is cast module by module (one that holds its states is not cast)."""
    return isinstance(target, torch.nn.Module) and not _holds_states(target)


@contextmanager
def at_other_precision(target, draft, target_dtype: torch.dtype, draft_dtype: torch.dtype):
    """``(target, draft)`` computing at ``target_dtype`` / ``draft_dtype`` inside the block: the same objects,
    their floating tensors cast in place (module doc: the target one module at a time during its forward, when
    ``_by_module``; one that holds its states not at all; the draft whole) and every original put back on exit,
    also when the block raises.

    Raises:
        CastError: a tensor could not be cast (everything cast so far is restored first).
    """
    with ExitStack() as stack:
        stack.enter_context(cast_whole(draft, draft_dtype))
        if _by_module(target):
            stack.enter_context(cast_by_module(target, target_dtype))
        elif not _holds_states(target):
            stack.enter_context(cast_whole(target, target_dtype))
        yield target, draft


def _need_bytes(target, draft, target_dtype: torch.dtype, draft_dtype: torch.dtype) -> int:
    """What the re-run adds to the models: the draft at its other dtype, and the target's largest module (cast
    module by module) or the whole target (cast whole) at its own (nothing for one that holds its states)."""
    if _holds_states(target):
        return whole_cast_bytes(draft, draft_dtype)
    if _by_module(target):
        return whole_cast_bytes(draft, draft_dtype) + largest_module_bytes(target, target_dtype)
    return whole_cast_bytes(draft, draft_dtype) + whole_cast_bytes(target, target_dtype)


def _fresh(replayer, target, draft):
    """A shallow copy of ``replayer`` computing with ``target`` and ``draft``, with its own
    acceptance tallies (the probe's rows are not the trace's)."""
    twin = copy.copy(replayer)
    twin.target, twin.draft = target, draft
    for tally in ("accept", "accept_cum", "chain"):
        setattr(twin, tally, AcceptTally(replayer.steps))
    return twin


def measure_noise_floor(replayer, seqs, seq_ids: list[int], *, skip: bool = False) -> dict:
    """The ``noise_floor`` contract fact of a training side.

    Args:
        replayer: the ``TrainReplayer`` that recorded the trace (its target and draft at the recorded
            dtypes; as they were after: the re-run casts in place and restores, ``at_other_precision``, and
            keeps its own acceptance tallies).
        seqs: the recorded ``TrainSequence`` list; seq_ids: their trace seq ids.
        skip: record the floor as not measured (``record train --no-noise-floor``).

    Returns:
        ``{"method": str, "sequences": int, "tensors": {name: {"median_rel", "p90_rel", "rows"}}}``
        for every float tensor the forward records (relative errors as float, rows an int), or
        ``{"method": None, "unmeasured": reason}`` when the re-run could not be made.
    """
    if skip:
        return {"method": None, "unmeasured": "record train --no-noise-floor"}
    target, draft = replayer.target, replayer.draft
    t_dtype = next(target.parameters()).dtype
    d_dtype = next(draft.parameters()).dtype
    device = next(target.parameters()).device
    other_t, other_d = other_dtype(t_dtype), other_dtype(d_dtype)
    try:
        need = _need_bytes(target, draft, other_t, other_d)
    except CastError as e:
        return {"method": None, "unmeasured": f"could not cast the models to the other precision: {e}"}
    if need > _free_bytes(device) // 2:
        return {"method": None, "unmeasured": f"the {other_t} re-run holds {need / 2**30:.1f} GiB more, "
                                              "more than half the free memory"}
    picked = probe_sequences([len(s.tokens) for s in seqs])
    if not picked:
        return {"method": None, "unmeasured": "no sequence to re-run"}
    ids, lengths = replayer.pad([seqs[i] for i in picked])
    keys = [seq_ids[i] for i in picked]
    base = _fresh(replayer, target, draft)  # the trace's acceptance tallies stay as recorded
    batch = [seqs[i] for i in picked]
    recorded = base.rows(keys, *base.forward(ids, lengths, batch)).collected()
    try:
        with at_other_precision(target, draft, other_t, other_d) as (t, d):
            twin = _fresh(replayer, t, d)
            rerun = twin.rows(keys, *twin.forward(ids, lengths, batch)).collected()
    except CastError as e:  # a trainer's model whose tensors refuse the cast: say so, record the trace anyway
        return {"method": None, "unmeasured": f"could not cast the models to the other precision: {e}"}
    tensors = {}
    for name, (data, *_keys) in recorded.items():
        try:
            kind = spec_for(name).kind
        except KeyError:
            continue
        if kind != "float" or name not in rerun or rerun[name][0].shape != data.shape or not data.shape[0]:
            continue
        x = data.detach().to(torch.float32).cpu().reshape(data.shape[0], -1).numpy()
        y = rerun[name][0].detach().to(torch.float32).cpu().reshape(data.shape[0], -1).numpy()
        rel = relative_error(x, y)
        rel = rel[np.isfinite(rel) & np.isfinite(x).all(1) & np.isfinite(y).all(1)]
        if len(rel):
            tensors[name] = {"median_rel": float(np.median(rel)), "p90_rel": float(np.quantile(rel, 0.9)),
                             "rows": int(len(rel))}
    return {"method": _method(t_dtype, d_dtype), "sequences": len(picked), "tensors": tensors}


def without_target_floor(floor: dict, why: str) -> dict:
    """The noise floor ``floor`` (``measure_noise_floor``'s dict) without its ``target.*`` stages, its method
    saying ``why`` they were not measured: a training side whose target states were not computed here (a
    trainer's stored features, a target run in a serving engine) has no target forward to re-run."""
    if not floor.get("tensors"):
        return floor
    kept = {k: v for k, v in floor["tensors"].items() if not k.startswith("target.")}
    return {**floor, "tensors": kept, "method": f"{floor['method']}; target.* not measured: {why}"}


def _method(target: torch.dtype, draft: torch.dtype) -> str:
    """How the floor was measured, in words: one dtype pair when target and draft share it (a trainer's
    draft may hold float32 weights under a bf16 target: each is then named)."""
    def name(d):
        return str(d).removeprefix("torch.")

    if target == draft:
        return f"the recorded {name(target)} forward re-run in {name(other_dtype(target))}"
    return (f"the recorded forward (target {name(target)}, draft {name(draft)}) re-run with target "
            f"{name(other_dtype(target))}, draft {name(other_dtype(draft))}")
