"""``record train --replay`` of a serving trace its server never closed and that holds no request (a server that
ended in its first iteration, no crash recorded) says so and what to do instead: record the training side from
the prompts that were sent. Before, it said only "the trace holds no token sequences to replay"."""

from __future__ import annotations

import numpy as np
import pytest

from specdiff.replay.record.sequences import sequences_from_trace
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.tracer.store import TraceWriter, open_trace


def _written(path, *, close: bool) -> str:
    w = TraceWriter(str(path), side="serve", contract={"engine": "sglang"})
    w.append("draft.d2t", np.zeros(8, np.int64), seq=-1, pos=range(8))  # what a server writes at start-up
    w.flush()
    if close:
        w.close()
    assert open_trace(str(path)).closed is close
    return str(path)


def test_a_never_closed_trace_without_requests_says_the_server_ended_and_to_use_the_prompts(tmp_path):
    with pytest.raises(RecordTrainError) as err:
        sequences_from_trace(_written(tmp_path / "died.trace", close=False))
    assert str(err.value).endswith(": the trace holds no token sequences to replay: it was never closed and "
                                   "records no crash (its server ended before it wrote a request); record the "
                                   "training side from the prompts that were sent (record train --prompts FILE)")


def test_a_closed_trace_without_requests_says_only_that(tmp_path):
    with pytest.raises(RecordTrainError) as err:
        sequences_from_trace(_written(tmp_path / "idle.trace", close=True))
    assert str(err.value).endswith(": the trace holds no token sequences to replay")
