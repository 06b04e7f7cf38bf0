"""Acceptance as evidence: with no tensor diverged, serving accepting fewer drafts than
training's chain at the same verify steps beyond chance is a verdict of its own ("the outcome differs",
exit 1) naming the depths and the tensors not wholly compared; a correct pair's few near-tie disagreements
are not. Real zarr stores written by ``TraceWriter``; the pairing rule (training pos = verify pos - 1) is
the one measured on real servers (replay/diff/compare/outcome.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specdiff.replay.diff.compare.outcome import P_LIMIT, mcnemar_p
from specdiff.tracer.store import TraceWriter

STEPS = 3
N = 160  # tokens per sequence
PROMPT = 8


def _pair(tmp_path, *, serve_accepts, train_accepts, topk=1, coverage_gap=False):
    """A training and a serving trace of one sequence. Serving verifies at roots 8, 12, 16, ... and accepted
    ``serve_accepts(step)`` drafts there; training's chain at root - 1 accepts ``train_accepts(step)``.
    Both hold the same ``target.aux.0`` rows (so rows are compared and agree); ``coverage_gap``: training
    holds them at half the positions only (serving's other rows have no training row: left out)."""
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 100, size=N)
    aux = rng.standard_normal((N, 16)).astype(np.float32)
    roots = list(range(PROMPT, N - STEPS - 2, 4))
    base = {"num_layers": 4, "hidden_size": 16, "aux_hf_indices": [1], "dtype": "float32", "spec_steps": STEPS}
    paths = {}
    for side in ("train", "serve"):
        contract = {**base, **({"spec_topk": topk} if side == "serve" else {})}
        with TraceWriter(str(tmp_path / f"{side}.trace"), side=side, contract=contract, overwrite=True) as w:
            sid = w.add_sequence(toks, prompt_len=PROMPT, rid="r0")
            pos = np.arange(N - 1)
            if side == "train" and coverage_gap:
                pos = pos[::2]
            w.append("target.aux.0", aux[pos], seq=sid, pos=pos)
            for i, root in enumerate(roots):
                if side == "serve":
                    w.append("verify.accept_length", np.array([serve_accepts(i) + 1]), seq=sid, pos=[root])
                else:
                    m = train_accepts(i)
                    for d in range(STEPS):
                        w.append("draft.accept_cum", np.array([d < m]), seq=sid, pos=[root - 1], depth=d)
        paths[side] = str(tmp_path / f"{side}.trace")
    return paths["train"], paths["serve"]


def test_serving_accepting_less_at_the_last_depth_is_the_outcome_differing(tmp_path, run_cli):
    # the vllm-ascend PR 16166 class: later steps fed an id that never went through the vocab map; depth 3
    # accepted on 1 step in 5 where training's chain accepts on every step
    train, serve = _pair(tmp_path, serve_accepts=lambda i: 3 if i % 5 == 0 else 2, train_accepts=lambda i: 3,
                         coverage_gap=True)
    r = run_cli("diff", train, serve)
    assert r.exit_code == 1, r.output
    lead = " ".join(r.stdout.split("\n\n")[0].split())
    assert lead.startswith("the outcome differs: no tensor diverged, yet serving accepts differently from training "
                           "at the same steps (depth 3: serving 0.22, training 1.00 over the same 37 verify steps"), lead
    # named from serving's accounting (compare/accounting.py): the tensor, its rows left out and why
    assert lead.endswith("; serving rows not compared: target.aux.0: 79 of 159 rows left out, no training row"), lead
    assert "depth 1: serving 1.00, training 1.00, gap +0.00" in r.stdout  # the depths that agree are shown too
    js = json.loads(run_cli("diff", train, serve, "--format", "json").stdout)
    (d3,) = js["outcome_differs"]
    assert (d3["depth"], d3["steps"], d3["only_serving"], d3["only_training"]) == (3, 37, 0, 29)
    assert js["diverged"] is False and js["verdict"] == lead


def test_a_correct_pairs_few_disagreements_both_ways_are_no_verdict(tmp_path, run_cli):
    # near-tied argmaxes: one step each way at one depth (the demo's fixed pairs: 1 of 54 and 1 of 30)
    train, serve = _pair(tmp_path, serve_accepts=lambda i: 1 if i == 3 else 2 if i == 7 else 3 if i % 2 else 2,
                         train_accepts=lambda i: 3 if i % 2 else 2)
    r = run_cli("diff", train, serve, "--format", "json")
    js = json.loads(r.stdout)
    assert r.exit_code == 0 and "outcome_differs" not in js, r.stdout[:400]
    assert js["verdict"].startswith("no divergence: ")


def test_a_tree_accepting_more_than_the_chain_is_no_verdict_and_less_is(tmp_path, run_cli):
    # a top-k tree holds paths a chain does not draft: serving above training's chain is what a tree is for
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    more = _pair(tmp_path / "a", serve_accepts=lambda i: 3, train_accepts=lambda i: 1, topk=4)
    assert run_cli("diff", *more).exit_code == 0
    less = _pair(tmp_path / "b", serve_accepts=lambda i: 1, train_accepts=lambda i: 3, topk=4)
    r = run_cli("diff", *less)
    assert r.exit_code == 1 and r.stdout.startswith("the outcome differs: "), r.output


@pytest.mark.parametrize("b, c, p", [(0, 0, 1.0), (0, 1, 1.0), (1, 1, 1.0), (0, 10, 2 / 1024), (3, 3, 1.0)])
def test_mcnemar_p_is_the_exact_binomial_tail(b, c, p):
    assert mcnemar_p(b, c) == pytest.approx(p)


def test_ten_one_sided_disagreements_are_beyond_the_limit_and_three_are_not():
    assert mcnemar_p(0, 11) < P_LIMIT < mcnemar_p(0, 9)
