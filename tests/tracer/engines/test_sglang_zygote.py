"""The test session's SGLang zygote (tracer/engines/sglang/cpu/zygote.py, forked.py): CPU servers fork
from one pre-imported launcher only where nothing could tell them from a fresh process.

That a forked server computes what a fresh one does is checked where both serve the same prompts:
tests/tracer/engines/test_sglang_recorder.py ``test_traced_and_untraced_greedy_tokens_are_identical``
(``traced`` keeps SGLang's spawn, so it starts fresh; ``untraced`` is the shared server, forked).
"""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from specdiff.tracer.engines.sglang.cpu.forked import ZYGOTE_ENV, ForkedServer, zygote_accepts
from specdiff.tracer.engines.sglang.cpu.launch import SERVE_SCRIPT, ServerProcess, cpu_server_env
from specdiff.tracer.engines.sglang.cpu.serve import START_METHOD_ENV
from specdiff.tracer.engines.sglang.cpu.zygote import import_time_env


def _request(**env):
    base = cpu_server_env({"PATH": os.environ.get("PATH", ""), START_METHOD_ENV: "fork"})
    base.update(env)
    return [sys.executable, SERVE_SCRIPT, "--model-path", "m"], base


def _info():
    _, env = _request()
    return {"pid": os.getpid(), "executable": sys.executable, "env": import_time_env(env),
            "added": {"TORCHINDUCTOR_CACHE_DIR": "/root/.cache/sglang/inductor"}}


def test_a_server_that_starts_as_a_fresh_one_would_is_forked():
    argv, env = _request(SPECDIFF_TRACE="/t/x.trace", SPECDIFF_WRITER_NICE="0")  # read after the fork: fine
    assert zygote_accepts(_info(), argv, env, SERVE_SCRIPT)


def test_a_caller_that_imported_sglang_or_compiled_with_torch_still_forks():
    """Importing SGLang sets ``CUDA_CACHE_PATH`` / ``TORCHINDUCTOR_CACHE_DIR`` in the importer's
    environment (the tests import it in-process), and an in-process compile sets the latter to a
    folder of its own (seen in make test): cache locations are not import-time settings."""
    argv, env = _request(TORCHINDUCTOR_CACHE_DIR="/root/.cache/sglang/inductor")
    assert zygote_accepts(_info(), argv, env, SERVE_SCRIPT)
    argv, env = _request(TORCHINDUCTOR_CACHE_DIR="/elsewhere")  # a cache location changes no result
    assert zygote_accepts(_info(), argv, env, SERVE_SCRIPT)
    argv, env = _request(SGLANG_CPU_OMP_THREADS="1")  # an SGLang setting does
    assert not zygote_accepts(_info(), argv, env, SERVE_SCRIPT)


@pytest.mark.parametrize(("why", "change"), [
    ("another interpreter", lambda argv, env: argv.__setitem__(0, "/other/bin/python")),
    ("another entry point than the CPU recipe", lambda argv, env: argv.__setitem__(1, "-m")),
    ("SGLang's own spawn", lambda argv, env: env.pop(START_METHOD_ENV)),
    ("an import-time variable of its own", lambda argv, env: env.__setitem__("TORCHDYNAMO_DISABLE", "0")),
    ("an SGLang variable the zygote lacks", lambda argv, env: env.__setitem__("SGLANG_ENABLE_X", "1")),
])
def test_a_server_a_fork_would_start_differently_starts_fresh(why, change):
    argv, env = _request()
    change(argv, env)
    assert not zygote_accepts(_info(), argv, env, SERVE_SCRIPT), why


def test_a_sitecustomize_on_the_servers_path_starts_it_fresh(tmp_path):
    """``site`` runs a ``sitecustomize`` as the interpreter starts: a forked launcher has started."""
    (tmp_path / "sitecustomize.py").write_text("")
    argv, env = _request(PYTHONPATH=os.pathsep.join([cpu_server_env({})["PYTHONPATH"], str(tmp_path)]))
    assert not zygote_accepts(_info(), argv, env, SERVE_SCRIPT)
    (tmp_path / "sitecustomize.py").unlink()
    assert zygote_accepts(_info(), argv, env, SERVE_SCRIPT)


@pytest.mark.server
def test_a_cpu_server_forks_from_the_session_zygote_into_its_own_process_group(repo_models, server_env, tmp_path):
    if not os.environ.get(ZYGOTE_ENV):
        pytest.skip("no zygote in this session (tests/conftest.py starts one when server tests are selected)")
    srv = ServerProcess(repo_models / "target", env=server_env(), log_path=tmp_path / "server.log")
    with srv:
        assert isinstance(srv.proc, ForkedServer)
        assert os.getpgid(srv.pid) == srv.pid  # stop() signals the group, as for a spawned server
        out = srv.generate(input_ids=[1, 2, 3], max_new_tokens=4)
        assert len(out["output_ids"]) == 4
        assert srv.proc.poll() is None
        # SGLang's process titles, as in a spawned server (ServerProcess.stop finds the scheduler by it)
        names = {p.name() for p in psutil.Process(srv.pid).children(recursive=True)}
        assert {"sglang::scheduler", "sglang::detokenizer"} <= names, names
    assert srv.proc.returncode is not None
    deadline = time.monotonic() + 10  # SIGKILLed children are gone once their new parent reaps them
    while time.monotonic() < deadline:
        try:
            os.killpg(srv.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.pid, 0)  # the whole group is gone
