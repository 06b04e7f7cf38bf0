"""The training side's noise floor per stage: its own forward re-run at the other precision.

A correct pair differs only by rounding: serving and training are two bf16 approximations of one
float32 computation, so their per-row difference at a stage is of the size of one side's bf16 vs
float32 gap there (measured: SGLang 0.5.23's bf16 aux rows on a CPU, tiny 8-layer target, vs HF
bf16 3-4e-3, vs HF fp32 5-6e-3). A fixed tolerance (rel 0.05) cannot see a difference that is
systematic but small: a target with other decoder weights moved every aux row to about twice the
pair's noise and passed.
This module measures the floor the diff judges such a shift against
(replay/diff/judge/shift.py): ``record train`` re-runs its forward on a few of its sequences with
float32 copies of target and draft when it recorded in bf16 or fp16 (bf16 copies when it recorded
in float32), and records per float tensor the median and 90th percentile of the per-row relative
error between the two runs (the diff's own metric, eagle3/row_error.py).

The re-run needs a second copy of both models at the other precision; when that does not fit in
the memory the forward runs in (half of what is free), or the trainer's model cannot be copied, the
floor is recorded as not measured, with the reason.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from specdiff.eagle3.acceptance import AcceptTally
from specdiff.eagle3.row_error import relative_error
from specdiff.tracer.schema import spec_for

__all__ = ["FLOOR_TOKENS", "measure_noise_floor", "probe_sequences", "without_target_floor"]

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


def _other_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.bfloat16 if dtype == torch.float32 else torch.float32


def _param_bytes(module, dtype: torch.dtype) -> int:
    return sum(p.numel() for p in module.parameters()) * torch.empty((), dtype=dtype).element_size()


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def _recast(module, dtype: torch.dtype):
    """A copy of ``module`` with its floating parameters and buffers in ``dtype`` (integer buffers,
    such as d2t, kept as copies in theirs); ``module`` is not changed.

    Each floating tensor is converted straight into its copy (``deepcopy``'s memo holds the converted
    tensor under the original's id), so the copy never exists at the recorded dtype: ``deepcopy`` then
    ``.to(dtype)`` first held a whole second model at it. The peak is the original plus the copy at
    ``dtype``; that saves memory where the recorded dtype is the wider one (a float32 recording re-run in
    bfloat16: no float32 copy). A bfloat16 recording re-run in float32 peaks at the float32 copy either way
    (measured equal). Tensors shared between modules (a tied embedding) stay one tensor in the copy."""
    memo: dict[int, object] = {}
    for t in (*module.parameters(), *module.buffers()):
        if id(t) in memo or not t.is_floating_point():
            continue
        cast = t.detach().to(dtype=dtype, copy=True)
        memo[id(t)] = torch.nn.Parameter(cast, requires_grad=t.requires_grad) if isinstance(
            t, torch.nn.Parameter) else cast
    return copy.deepcopy(module, memo)


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
            dtypes; not changed: the re-run uses copies and its own acceptance tallies).
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
    other_t, other_d = _other_dtype(t_dtype), _other_dtype(d_dtype)
    need = _param_bytes(target, other_t) + _param_bytes(draft, other_d)
    if need > _free_bytes(device) // 2:
        return {"method": None, "unmeasured": f"a {other_t} copy of target and draft needs {need / 2**30:.1f} GiB, "
                                              "more than half the free memory"}
    picked = probe_sequences([len(s.tokens) for s in seqs])
    if not picked:
        return {"method": None, "unmeasured": "no sequence to re-run"}
    try:
        twin = _fresh(replayer, _recast(target, other_t), _recast(draft, other_d))
    except Exception as e:  # a trainer's model that cannot be deep-copied: say so, record the trace anyway
        return {"method": None, "unmeasured": f"could not copy the models at the other precision: {e}"}
    ids, lengths = replayer.pad([seqs[i] for i in picked])
    keys = [seq_ids[i] for i in picked]
    base = _fresh(replayer, target, draft)  # the trace's acceptance tallies stay as recorded
    batch = [seqs[i] for i in picked]
    recorded = base.rows(keys, *base.forward(ids, lengths, batch)).collected()
    rerun = twin.rows(keys, *twin.forward(ids, lengths, batch)).collected()
    del twin
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
        return f"the recorded {name(target)} forward re-run in {name(_other_dtype(target))}"
    return (f"the recorded forward (target {name(target)}, draft {name(draft)}) re-run with target "
            f"{name(_other_dtype(target))}, draft {name(_other_dtype(draft))}")
