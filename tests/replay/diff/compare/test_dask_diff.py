"""`specdiff diff --workers N` / `--dask ADDRESS`: the per-block metrics computed on Dask workers,
straight from the stores, give the same report, byte for byte, as the local diff.

The workers are real ``distributed.LocalCluster`` processes (2, single-threaded: the machine is
small); each opens the traces itself from their paths.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from specdiff.replay.diff.compare.blocks import ExecutorBlocks
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_json
from specdiff.replay.diff.types import UNREADABLE
from specdiff.tracer.store import TraceWriter

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[4]
SEED = ("traces/examples/seed/train.trace", "traces/examples/seed/serve.trace")  # relative: the JSON names them


@pytest.fixture(scope="module")
def client():
    """A 2-process local Dask cluster shared by this file's in-process tests (closed after)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as c:
        yield c


def _on_workers(client) -> ExecutorBlocks:
    return ExecutorBlocks(client.get_executor(pure=False), workers=2)


def _traces_opened_on_workers(client) -> list[int]:
    """Traces each worker process has opened itself (the block task's per-run cache)."""
    count = lambda: __import__("specdiff.replay.diff.compare.blocks", fromlist=["_opened"])._opened.cache_info().currsize
    return list(client.run(count).values())


def test_diff_on_two_dask_workers_gives_the_local_json_of_the_example_pair(run_cli, monkeypatch,
                                                                          assert_golden_seed_diff):
    monkeypatch.chdir(ROOT)
    result = run_cli("diff", *SEED, "--format", "json", "--workers", "2")
    assert result.exit_code == 1, result.stderr[-2000:]
    assert result.stderr == ""  # no Dask log line, no traceback at shutdown
    local = run_cli("diff", *SEED, "--format", "json")
    assert local.stdout_bytes == result.stdout_bytes  # byte for byte, on this CPU
    assert_golden_seed_diff(result.stdout_bytes)  # the golden file: a few float32 ulp on another CPU


def test_the_blocks_are_computed_by_the_workers_from_the_stores(client, monkeypatch, assert_golden_seed_diff):
    monkeypatch.chdir(ROOT)
    before = sum(_traces_opened_on_workers(client))
    report = diff_traces(*SEED, runner=_on_workers(client))
    assert sum(_traces_opened_on_workers(client)) > before  # each worker opened the pair by path
    got = render_json(report).encode() + b"\n"
    assert got == render_json(diff_traces(*SEED)).encode() + b"\n"  # the local diff's, byte for byte
    assert_golden_seed_diff(got)


# ---- damage found at open (a missing chunk), on read (a cut chunk) and in the row keys ------------
def _chunk(trace: Path, name: str, column: str = "data") -> Path:
    first = trace / "tensors" / name / column / "c" / "0"
    return first / "0" if first.is_dir() else first


def _cut(t: Path) -> None:
    # draft.hidden_out: read by nothing but its block compare (target.aux.0 would be re-read here by
    # the explanation, hiding a worker's finding that did not come back)
    f = _chunk(t, "draft.hidden_out")
    f.write_bytes(f.read_bytes()[:10])


def _deleted(t: Path) -> None:
    _chunk(t, "target.aux.2").unlink()


def _flipped_keys(t: Path) -> None:
    f = _chunk(t, "target.aux.1", "pos")
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))


# (damage, whether its rows stay aligned and show as UNREADABLE: rows whose keys are lost do not align)
DAMAGE = {"chunk cut": (_cut, True), "chunk deleted": (_deleted, True), "key chunk flipped": (_flipped_keys, False)}


@pytest.mark.parametrize("kind", list(DAMAGE))
@pytest.mark.parametrize("side", [0, 1], ids=["train damaged", "serve damaged"])
def test_a_damaged_pair_diffs_on_workers_with_the_same_unreadable_rows_and_damage_lines(
        client, tmp_path, kind, side):
    damage, unreadable_rows = DAMAGE[kind]
    shutil.copytree(ROOT / "traces" / "examples" / "seed", tmp_path / "seed", symlinks=True)
    pair = [str(tmp_path / "seed" / "train.trace"), str(tmp_path / "seed" / "serve.trace")]
    damage(Path(pair[side]))
    local = diff_traces(*pair)
    remote = diff_traces(*pair, runner=_on_workers(client))
    assert local.damage and local.incomplete  # the damage is real and costs rows
    assert render_json(remote) == render_json(local)
    for name, comp in local.comparisons.items():
        assert np.array_equal(remote.comparisons[name].status == UNREADABLE, comp.status == UNREADABLE), name
    assert any((c.status == UNREADABLE).any() for c in remote.comparisons.values()) == unreadable_rows


# ---- a serving trace still being written, recorded per data-parallel rank -------------------------
CONTRACT = {"engine": "sglang", "hidden_size": 16, "aux_hf_indices": [1], "dtype": "bfloat16"}


def _requests(rng, n: int):
    return [(f"req{i}", rng.integers(0, 40, size=30 + i)) for i in range(n)]


def _record(w: TraceWriter, seqs, aux, *, noise: float = 0.0) -> None:
    for rid, toks in seqs:
        sid = w.add_sequence(toks, prompt_len=3, rid=rid)
        w.append("tokens", torch.from_numpy(toks.astype(np.int64)), seq=sid, pos=np.arange(len(toks)))
        w.append("target.aux.0", (aux[rid] + noise).to(torch.bfloat16), seq=sid, pos=np.arange(len(toks)))


def test_a_per_rank_serving_trace_still_being_written_diffs_the_same_on_workers(client, tmp_path):
    rng = np.random.default_rng(0)
    seqs = _requests(rng, 6)
    aux = {rid: torch.from_numpy(rng.standard_normal((len(t), 16)).astype(np.float32)) for rid, t in seqs}
    with TraceWriter(str(tmp_path / "train.trace"), side="train", contract=CONTRACT, chunk_bytes=256) as w:
        _record(w, seqs, aux)
    serve = tmp_path / "serve.trace"
    with TraceWriter(str(serve / "dp0"), side="serve", contract=CONTRACT, chunk_bytes=256) as w:
        _record(w, seqs[:3], aux)
    open_writer = TraceWriter(str(serve / "dp1"), side="serve", contract=CONTRACT, chunk_bytes=256)
    try:  # dp1 is never closed while diffed: its last rows are in the journal's spill, not in zarr
        _record(open_writer, seqs[3:], aux, noise=0.5)  # rank 1 diverges
        local = diff_traces(str(tmp_path / "train.trace"), str(serve))
        remote = diff_traces(str(tmp_path / "train.trace"), str(serve), runner=_on_workers(client))
        assert not local.traces.y.closed and local.first is not None
        assert render_json(remote) == render_json(local)
    finally:
        open_writer.close()


# ---- errors: one line, exit 2 --------------------------------------------------------------------
def test_an_unreachable_dask_scheduler_is_one_error_line(run_cli, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = run_cli("diff", *SEED, "--format", "json", "--dask", "tcp://127.0.0.1:9")
    assert result.exit_code == 2
    assert result.stderr.startswith("specdiff: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9 ")
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_dask_missing_is_one_error_line(run_cli, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setitem(sys.modules, "distributed", None)  # what an environment without it imports
    result = run_cli("diff", *SEED, "--workers", "2")
    assert result.exit_code == 2
    assert result.stderr.startswith("specdiff: error: --workers/--dask need dask.distributed")
    assert result.stderr.count("\n") == 1


def test_a_memory_url_pair_is_refused_before_any_worker_starts(run_cli):
    result = run_cli("diff", "memory://a.trace", "memory://b.trace", "--workers", "2")
    assert result.exit_code == 2
    assert result.stderr == ("specdiff: error: memory://a.trace: a memory:// trace lives in this process only, so "
                             "Dask workers cannot read it; write it to a path or a shared URL (s3://, gs://, "
                             "file://), or diff without --workers/--dask\n")


def test_workers_and_dask_together_are_refused(run_cli):
    result = run_cli("diff", *SEED, "--workers", "2", "--dask", "tcp://127.0.0.1:9")
    assert result.exit_code == 2 and "not both" in result.stderr


def test_the_diff_command_does_not_import_dask_unless_asked():
    code = ("import sys; import specdiff.tui.cli, specdiff.tui.cmd_diff, specdiff.replay.diff.pipeline, "
            "specdiff.replay.diff.report; "
            "print(sorted(m for m in ('dask', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
