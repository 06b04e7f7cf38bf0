"""The narrowing re-runs the first divergence's failing rows at their depth, and never contradicts it.

Real parts: the committed demo target and draft, ``record_train``; the "serving" trace is the
training trace with one kind of difference the re-run cannot reproduce from any recorded input
(the draft's depth-1 output moved while every input agrees: what a stale draft KV history does).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.record.record_train import record_train
from specdiff.tracer.store import TraceWriter, open_trace

pytestmark = pytest.mark.slow

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)


def _moved_at_depth(src: str, dst: str, *, name: str, depth: int, rel: float) -> str:
    """A copy of trace ``src`` whose ``name`` rows at ``depth`` are moved by ``rel`` of their norm."""
    t = open_trace(src)
    rng = np.random.default_rng(0)
    with TraceWriter(dst, side="serve", contract=dict(t.contract)) as w:
        for s in t.sequences:
            w.add_sequence(s.tokens, prompt_len=s.prompt_len, rid=s.rid, seq_id=s.id)
        for n in t.names:
            k = t.keys(n, columns=("seq", "pos", "depth", "iter"))
            data = t.read_torch(n)
            if n == name:
                x = data.float().numpy()
                sel = k["depth"] == depth
                d = rng.standard_normal(x[sel].shape).astype(np.float32)
                x[sel] += rel * np.linalg.norm(x[sel], axis=1, keepdims=True) * d / np.linalg.norm(d, axis=1, keepdims=True)
                import torch
                data = torch.as_tensor(x).to(data.dtype)
            w.append(n, data, seq=k["seq"], pos=k["pos"], depth=k["depth"], iter=k["iter"])
    return dst


def test_a_depth1_difference_no_input_explains_is_rerun_at_depth1_and_undecided(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": demo_prompts(REPO_MODELS, 1)[0]}) + "\n")
    train = str(tmp_path / "train.trace")
    record_train(REPO_MODELS / "target", REPO_MODELS / "draft", train, prompts=prompts, max_new_tokens=12,
                 probe_positions=0)
    serve = _moved_at_depth(train, str(tmp_path / "serve.trace"), name="draft.hidden_out", depth=1, rel=0.3)
    report = diff_traces(train, serve)
    first = report.first
    assert first.name == "draft.hidden_out" and first.divergence_depth == 1, report.verdict()
    n = report.narrowing
    assert not isinstance(n, str), n
    assert n.depth == 1 and n.from_stage == "draft.hidden_out"
    assert n.rows == int((first.judged_fail & (first.match.depth == 1)).sum())  # every failing row of the pair re-run
    base = n.variants[0]
    assert base.name == "training inputs" and not base.reproduces
    assert base.scores["draft.attn_in"] < 0.02  # the re-run agrees with serving where serving agrees
    assert not any(v.reproduces for v in n.variants)
    assert not n.decided and n.conclusion.startswith("cannot decide") and "KV history" in n.conclusion
    assert "training inputs reproduce" not in n.conclusion
    text = render_text(report)
    assert "re-run through depth 1" in text and "-> cannot decide" in text
