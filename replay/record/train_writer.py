"""Writing a training trace from a loaded ``TrainSide``: its contract, every batch's rows through the
background writer, the acceptance and the noise floor at the end. ``record train`` writes its replay of
token sequences with it (replay/record/record_train.py), ``record train --features`` its forward on a
trainer's stored features (replay/record/record_features.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdiff.eagle3.aux_layers import AuxResolution
from specdiff.replay.record.noise_floor import measure_noise_floor
from specdiff.tracer.engines.writer.thread import AsyncTraceWriter

__all__ = ["RecordTrainResult", "write_train_trace"]


@dataclass
class RecordTrainResult:
    """What ``record_train`` wrote.

    Attributes:
        path: the trace.
        sequences / positions: sequences replayed and their total length.
        aux: the aux resolution used (training layers).
        accept_rate: per depth k, the fraction of valid rows with ``draft.accept``.
        accept_cum_rate: per depth k, the fraction with ``draft.accept_cum``.
        mean_accept_length: chain accept length 1 + sum_k accept_cum, averaged over positions
            whose every depth is valid (SGLang's ``spec_accept_length`` counts the bonus token too).
        seconds: wall time of the replay (model loading excluded).
        notes: plain-words remarks (draft notes, aux notes).
        defaults_used: option -> {"value", "source"} for every option the caller left unset.
    """

    path: str
    sequences: int
    positions: int
    aux: AuxResolution
    accept_rate: list[float]
    accept_cum_rate: list[float]
    mean_accept_length: float
    seconds: float
    notes: list[str] = field(default_factory=list)
    defaults_used: dict[str, dict] = field(default_factory=dict)


def write_train_trace(side, seqs, out: str, *, replay: str | None = None, overwrite: bool = False,
                      max_batch_tokens: int = 8192, noise_floor: bool = True,
                      floor_filter: Callable[[dict], dict] | None = None,
                      progress: Callable[[int], None] | None = None,
                      on_start: Callable[[int, RecordTrainResult], None] | None = None) -> RecordTrainResult:
    """Write the training trace of ``side`` (a ``train_side.TrainSide``) over ``seqs`` at ``out``.

    Args:
        replay: the serving trace the sequences come from (contract ``replay_of``), or None.
        noise_floor: measure the floor (replay/record/noise_floor.py); ``floor_filter``: applied to it
            before it is recorded (the features side drops what it cannot measure).
        progress: called with the number of sequences finished after each batch.
        on_start: called once with (total sequences, a result stub holding aux, notes and defaults_used).

    Raises:
        RecordTrainError / TraceError: the contract does not validate, ``out`` exists, a write fails.
    """
    facts, notes = side.contract(seqs, out=str(out), replay=replay)
    writer, seq_ids = side.open_trace(str(out), seqs, facts, overwrite=overwrite)
    rep = side.replayer
    result = RecordTrainResult(str(out), len(seqs), int(sum(len(s.tokens) for s in seqs)), side.aux,
                               [], [], float("nan"), 0.0, notes, side.defaults_used)
    if on_start:
        on_start(len(seqs), result)
    t0 = time.perf_counter()
    # Appends run on one thread so compression and I/O overlap the next batch's forward;
    # lossless: a full queue waits, and a write error is raised here by submit / close.
    aw = AsyncTraceWriter(writer, lambda w, item: item[1].flush(w), max_items=2, lossless=True,
                          on_written=(lambda item: progress(item[0])) if progress else None)
    end: dict = {}
    try:
        for item in side.batches(seqs, seq_ids, max_batch_tokens=max_batch_tokens):
            aw.submit(item)
        end = side.accept_facts()
        acc, acc_cum, mean = rep.accept_rates()
        floor = measure_noise_floor(rep, seqs, seq_ids, skip=not noise_floor)
        end["noise_floor"] = floor_filter(floor) if floor_filter else floor
    finally:
        aw.close(timeout_s=None, contract=end)
    result.accept_rate, result.accept_cum_rate, result.mean_accept_length = acc, acc_cum, mean
    result.seconds = time.perf_counter() - t0
    return result
