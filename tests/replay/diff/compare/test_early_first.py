"""The first divergence is said as soon as the rows read prove it, and it is the full data's.

Every in-process diff of the test suite also checks early == full (tests/conftest.py); these
tests show when the early answer comes (after a few blocks, not after the whole trace) and when
it must wait for the full data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builders import TracePair

from specdiff.replay.diff.compare import blocks
from specdiff.replay.diff.compare.early import EarlyFirst
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.tracer.schema import aux_name

H, N_SEQ, SEQ_LEN = 64, 16, 256
EXAMPLE = Path(__file__).resolve().parents[4] / "traces" / "examples" / "seed"


def write_pair(root: Path, *, bad_seqs=(), scale=0.5) -> tuple[str, str]:
    """Training and serving traces of three aux slots; in ``bad_seqs`` serving's slot 0 is off by
    ``scale`` (relative), elsewhere equal to training up to bf16-sized noise."""
    pair = TracePair(root, contract={"hidden_size": H, "dtype": "float32"})
    rng = pair.rng
    for s in range(N_SEQ):
        toks = rng.integers(0, 1000, SEQ_LEN + 1)
        layers = rng.standard_normal((3, SEQ_LEN, H)).astype(np.float32)
        for w in pair.sides(s, toks, prompt_len=8):
            k = w.index
            pos = np.arange(SEQ_LEN)
            for j in range(3):
                x = layers[j] * (1 + 1e-6 * rng.standard_normal((1, H))).astype(np.float32) if k else layers[j]
                if k and j == 0 and s in bad_seqs:
                    x = x * (1 + scale)
                    x[:, 0] += scale * 10
                w.append(aux_name(j), x, pos=pos)
            w.append("tokens", toks[1:].astype(np.int64), pos=pos)
    return pair.close()


def diff_watching(a: str, b: str) -> tuple:
    """The report, the early answer and how many rows had been compared when it came."""
    seen: dict = {}
    done = [0]

    def on_rows(d, total):
        done[0], seen["total"] = d, total

    def on_first(early):
        seen["early"], seen["rows"] = early, done[0]

    report = diff_traces(a, b, narrow=False, on_first=on_first, on_rows=on_rows)
    return report, seen


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(blocks, "BLOCK_BYTES", 128 * 4 * H)  # 128 rows a block


def test_a_divergence_in_the_first_rows_is_said_after_a_few_blocks(tmp_path, small_blocks):
    a, b = write_pair(tmp_path, bad_seqs=range(N_SEQ))
    report, seen = diff_watching(a, b)
    assert seen["early"] == EarlyFirst("target.aux.0", "values", {"pair": 0, "pos": 0, "depth": 0})
    assert report.first.name == "target.aux.0" and report.first.first_where == seen["early"].where
    # tokens (read in full: it comes first in dataflow order) plus one block of target.aux.0
    assert seen["rows"] == N_SEQ * SEQ_LEN + 128 < seen["total"] / 3


def test_a_divergence_only_near_the_end_waits_for_the_rows_that_prove_it(tmp_path, small_blocks):
    # 1 of 16 sequences diverges (6% of rows > the 2% fail fraction), the last: the early rows
    # cannot prove it, so it is said once that sequence is read, and is the same as the full data's.
    a, b = write_pair(tmp_path, bad_seqs=(N_SEQ - 1,))
    report, seen = diff_watching(a, b)
    assert report.first.name == "target.aux.0"
    assert seen["early"].where == {"pair": N_SEQ - 1, "pos": 0, "depth": 0}
    # tokens in full, then target.aux.0 up to the first block of the last sequence
    assert seen["rows"] == N_SEQ * SEQ_LEN + (N_SEQ - 1) * SEQ_LEN + 128


def test_failing_first_rows_under_the_fail_fraction_are_never_said_to_diverge(tmp_path, small_blocks):
    # Sequence 0 fails in full: 256 of 4096 rows (6%). Its first block alone (128 rows, 3%)
    # already proves a divergence at the default 2% fail fraction; at 10% no prefix may claim one.
    a, b = write_pair(tmp_path, bad_seqs=(0,))
    report, seen = diff_watching(a, b)
    assert report.first.name == "target.aux.0" and seen["rows"] <= N_SEQ * SEQ_LEN + 128
    said = []
    loose = diff_traces(a, b, narrow=False, overrides={"target.aux": {"max_fail_frac": 0.1}}, on_first=said.append)
    assert loose.first is None and said == []


@pytest.mark.skipif(not (EXAMPLE / "serve.trace").exists(), reason="the shipped example pair is absent")
def test_the_shipped_seed_pair_says_its_first_divergence_early():
    report, seen = diff_watching(str(EXAMPLE / "train.trace"), str(EXAMPLE / "serve.trace"))
    w = report.first.first_where
    assert seen["early"] == EarlyFirst(report.first.name, report.first.kind, w)
    assert seen["rows"] < seen["total"]


def test_the_app_shows_the_proven_first_divergence_and_a_partial_grid_before_the_report(tmp_path, small_blocks):
    import asyncio

    from specdiff.tui.app import SpecdiffApp
    from specdiff.tui.view import Sel

    a, b = write_pair(tmp_path, bad_seqs=range(N_SEQ))
    app = SpecdiffApp(a, b, export_root=tmp_path)

    async def run():
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(600):
                if app.vm is not None:
                    break
                await pilot.pause(0.02)

    asyncio.run(run())
    # the early message and the partial grid arrived (they are only posted before the report)
    assert app.early == EarlyFirst("target.aux.0", "values", {"pair": 0, "pos": 0, "depth": 0})
    assert app.partial is not None and app.partial.first == Sel("target.aux.0", 0, 0, 0)
    assert app.vm.first == app.partial.first == app.sel


def test_inherited_rows_neither_prove_nor_place_the_early_first_divergence(tmp_path, small_blocks):
    # Slot 0 differs at seq 0 positions 0 and 1 only (2 rows: noise within its fail fraction), and
    # slots 1 and 2 differ there too (they inherit it). Slot 2 is also wrong everywhere else.
    # The rows inherited from slot 0 do not count: the first divergence is target.aux.2 at the
    # earliest row (position, then sequence) whose inputs agree: seq 1 pos 0, not seq 0 pos 0;
    # said early, and the full data's.
    pair = TracePair(tmp_path, contract={"hidden_size": H, "dtype": "float32"}, seed=1)
    for s in range(N_SEQ):
        toks = pair.rng.integers(0, 1000, SEQ_LEN + 1)
        layers = pair.rng.standard_normal((3, SEQ_LEN, H)).astype(np.float32)
        for w in pair.sides(s, toks, prompt_len=8):
            x = layers.copy()
            if w.serving:
                x[2] *= 1.5
                if s == 0:
                    x[:, :2] += 1.0
            for j in range(3):
                w.append(aux_name(j), x[j], pos=np.arange(SEQ_LEN))
            w.append("tokens", toks[1:].astype(np.int64), pos=np.arange(SEQ_LEN))
    report, seen = diff_watching(*pair.close())
    assert report.first.name == "target.aux.2" and report.first.stats["inherited_rows"] == 2
    assert seen["early"] == EarlyFirst("target.aux.2", "values", {"pair": 1, "pos": 0, "depth": 0}), seen
    assert report.comparisons["target.aux.1"].stats["inherited_from"] == {"target.aux.0": 2}
    assert not report.comparisons["target.aux.1"].diverged
    # tokens and slots 0 and 1 in full, then slot 2 up to the first block of seq 1 (the position
    # is final once no unread row can come before seq 1 pos 0)
    assert seen["rows"] == N_SEQ * SEQ_LEN * 3 + SEQ_LEN + 128
