"""The vocab map kinds (replay/diff/explain/vocab.py): how each side turned draft ids into target ids,
named from the recorded d2t and the rows, each kind with its own fix (replay/diff/causes.py).

``d2t_other_map`` is the kind where both sides read d2t as offsets, correctly, but hold different
maps: tested on several other maps, on either side, and against a pair it must not name.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from specdiff.replay.diff.causes import cause_row
from specdiff.replay.diff.explain.vocab import explain_vocab_map
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.types import Pair
from specdiff.tracer.store import open_trace


def other_map(aux_traces, seed: int) -> np.ndarray:
    """Another draft vocabulary of the same size, saved as offsets: d2t int64 [VD]."""
    hot = np.sort(np.random.default_rng(seed).choice(200, aux_traces.VD, replace=False))
    return (hot - np.arange(aux_traces.VD)).astype(np.int64)


@pytest.mark.parametrize("seed", [7, 11, 23])
@pytest.mark.parametrize("other_side", ["serve", "train"])
def test_another_offset_map_is_named_d2t_other_map_with_its_own_fix(tmp_path, aux_traces, seed, other_side):
    d2t = {other_side: other_map(aux_traces, seed)}
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], d2t=d2t.get("train"))
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=d2t.get("serve"))
    report = diff_traces(a, b)
    assert report.first.name == "draft.topk_target"
    assert [e.cause for e in report.explanations] == ["d2t_other_map"]
    cause = report.explanations[0]
    assert cause.fix == cause_row("d2t_other_map").fix and cause.fix != cause_row("d2t_direct_ids").fix
    differ = int((other_map(aux_traces, seed) != aux_traces.D2T).sum())
    assert f"({differ} of {aux_traces.VD} draft ids" in cause.message
    assert cause.evidence[0].startswith("the draft ids agree on 100.0%")


def test_a_direct_ids_map_is_still_direct_ids_not_another_map(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=aux_traces.D2T + np.arange(aux_traces.VD))
    assert [e.cause for e in diff_traces(a, b).explanations] == ["d2t_direct_ids"]


def test_mapped_ids_that_no_recorded_map_gives_are_not_blamed_on_the_map(tmp_path, aux_traces):
    # serving holds another map but maps the draft ids by some other rule (one id too far): the map
    # alone does not close the gap, so it is not named
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=other_map(aux_traces, 7),
                         topk_fn=lambda ids, d2t: ids + d2t[ids] + 1)
    report = diff_traces(a, b)
    assert report.first.name == "draft.topk_target"
    assert "d2t_other_map" not in [e.cause for e in report.explanations]


def test_the_json_report_names_the_kind_and_its_fix(tmp_path, aux_traces):
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=other_map(aux_traces, 11))
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    explanations = json.loads(proc.stdout)["explanations"]
    assert [(e["cause"], e["fix"]) for e in explanations] == [("d2t_other_map", cause_row("d2t_other_map").fix)]


def test_the_map_is_named_only_where_it_is_applied(tmp_path, aux_traces):
    # the map turns draft ids into target ids after the logits: a difference first seen at the
    # logits or the draft ids is never blamed on it, though the maps differ
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6])
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=other_map(aux_traces, 7))
    traces, alignment = Pair(open_trace(a), open_trace(b)), diff_traces(a, b).alignment
    assert [e.cause for e in explain_vocab_map(traces, alignment, "draft.topk_target")] == ["d2t_other_map"]
    for stage in ("draft.logits", "draft.topk"):
        assert explain_vocab_map(traces, alignment, stage) == []
    assert cause_row("d2t_other_map").stages == ("draft.topk_target", "verify")


def test_recorded_map_hashes_that_differ_stay_a_contract_warning_under_the_named_kind(tmp_path, aux_traces):
    # both contracts record their d2t's sha256 (as the recorders do): the proven kind is the
    # explanation, and the contract still lists the differing fact, with a fix that fits every map kind
    other = other_map(aux_traces, 23)
    a = aux_traces.write(tmp_path / "a", side="train", hf=[0, 3, 6], facts={"d2t_sha256": "a" * 64})
    b = aux_traces.write(tmp_path / "b", side="serve", hf=[0, 3, 6], d2t=other, facts={"d2t_sha256": "b" * 64})
    report = diff_traces(a, b)
    assert [e.cause for e in report.explanations] == ["d2t_other_map"]
    d2t = [m for m in report.contract if m.field == "d2t_sha256"]
    assert len(d2t) == 1 and d2t[0].severity == "warn"
    # the fix is the wording a user acts on: serve training's map, not "export d2t as offsets"
    assert d2t[0].fix.startswith("serve the d2t of the draft checkpoint training used")
