"""The trace writer process outlives the server's process tree: SGLang 0.5.23
stops by SIGKILLing every descendant psutil lists (``kill_process_tree``, srt/utils/common.py:
2507-2564), which killed the writer while it lagged and cut the trace. Here a real
``ProcessTraceWriter`` in a stand-in server process is held back (``SPECDIFF_WRITER_TEST_PAUSE_FILE``:
the writer handles no item while that file exists), asked to close, and the process is ended by
SGLang's own ``kill_process_tree``; no server is started."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specdiff.tracer.engines.writer.alive import wait_for_writers, writer_pids
from specdiff.tracer.store import open_trace

#: the stand-in server: opens the writer, hands it a contract update, asks for the close (which the
#: held-back writer cannot answer in time), says what it saw, then stops as SGLang does
SERVER = """
import os, sys
import psutil
from sglang.srt.utils import kill_process_tree
from specdiff.tracer.engines.recorder import ContractUpdate
from specdiff.tracer.engines.writer.process import ProcessTraceWriter

w = ProcessTraceWriter(sys.argv[1], contract={"hidden_size": 8},
                       handler="specdiff.tracer.engines.sglang.attribution:write_capture",
                       side={"hidden_size": 8, "num_aux": 3, "topk": 1})
w.submit(ContractUpdate({"aux_hf_indices": [2, 4, 5]}))
closed = w.close(timeout_s=0.5)
listed = w.writer_pid in [p.pid for p in psutil.Process().children(recursive=True)]
print(w.writer_pid, closed, listed, flush=True)
kill_process_tree(os.getpid())
"""


@pytest.mark.slow  # imports SGLang and torch in two processes: ~100 s at load 14 on 2 cores
def test_the_writer_outlives_sglangs_kill_of_the_server_tree_and_closes_the_trace(tmp_path):
    pytest.importorskip("sglang")
    path, pause = str(tmp_path / "t.trace"), tmp_path / "writer.pause"
    pause.touch()
    # the server's priority: at nice 19 a writer on a loaded machine takes minutes to start and close
    env = {**os.environ, "SPECDIFF_WRITER_TEST_PAUSE_FILE": str(pause), "SPECDIFF_WRITER_NICE": "0"}
    with open(tmp_path / "stderr.log", "wb") as err:  # the writer keeps it: a pipe would wait for the writer
        p = subprocess.run([sys.executable, "-c", SERVER, path], env=env, stdout=subprocess.PIPE, stderr=err,
                           text=True, timeout=300)
    try:
        log = (tmp_path / "stderr.log").read_text(errors="replace")[-3000:]
        assert p.returncode == -9, log  # SIGKILLed by kill_process_tree, as SGLang's stop ends
        pid, closed, listed = p.stdout.split()
        assert (closed, listed) == ("False", "False"), log  # held back; not the server's child
        assert writer_pids(path) == [int(pid)]  # alive after the kill, found by its trace's path
        assert not open_trace(path).closed
    finally:
        pause.unlink()
    assert wait_for_writers(path, timeout_s=120) == []
    t = open_trace(path)
    assert t.closed and t.contract["aux_hf_indices"] == [2, 4, 5] and t.contract["dropped_records"] == 0
