"""A stage inside its tolerance is not proof that it agrees.

Two judgements trusted the fixed tolerance where the pair's noise floor (replay/diff/judge/shift.py) or
the contract say more:

- the halves check (explain/halves.py) told "draft hidden states agree but logits do not: the lm_head
  differs" whenever ``draft.hidden_out`` did not diverge, even with the lm_head the same on both sides
  by the contract's own sha256 (a draft whose final norm weights differ: "the lm_head differs (A:
  draft, B: draft)");
- the named differences (explain/differences.py) ruled out a recorded fact acting at an earlier stage
  whose rows did not diverge, though they sat above the noise (a draft's MLP weights 0.3 % apart:
  ``draft.hidden_out`` at 1.7x its floor, the top-k ids diverged): "no known cause".

Synthetic pairs (tests/builders.py ``dataflow_pair``: serving's logits moved, its hidden_out nudged by
0.8 % of each row, a floor of 0.004 in the contract) for each side of both rules; real training traces
(``record train --replay`` of the shipped seed sequences) with a draft whose final norm or whose
lm_head differs.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from builders import dataflow_pair
from safetensors.torch import load_file, save_file

from specdiff.replay.diff.explain.differences import differences_at
from specdiff.replay.diff.judge.shift import AT_NOISE_RATIO, FLOOR_RATIO
from specdiff.replay.diff.pipeline import diff_traces

FLOOR = {"method": "a re-run", "tensors": {n: {"median_rel": 0.004, "p90_rel": 0.006, "rows": 100}
                                           for n in ("draft.attn_in", "draft.hidden_out", "draft.logits")}}
BASE = {"hidden_size": 16, "draft_hidden_size": 16, "num_layers": 8, "aux_hf_indices": [1, 4, 7], "dtype": "bfloat16",
        "noise_floor": FLOOR}
MLP = "midlayer.mlp.down_proj.weight"


def _pair(tmp_path, *, nudged: bool, lm_head: tuple[str | None, str | None] = ("c" * 64, "c" * 64)):
    train = {"engine": "specdiff-reference", "draft_weights": {MLP: "a" * 16}}
    serve = {"draft_weights": {MLP: "b" * 16}}
    for side, sha in zip((train, serve), lm_head):
        if sha is not None:
            side["lm_head_sha256"] = sha
    a, b = dataflow_pair(tmp_path, contract=BASE, train=train, serve=serve, moved="draft.logits",
                         nudged="draft.hidden_out" if nudged else None)
    return diff_traces(a, b, narrow=False)


def test_a_fact_acting_where_the_rows_sit_above_the_noise_is_named(tmp_path):
    report = _pair(tmp_path, nudged=True)
    hidden = report.comparisons["draft.hidden_out"]
    assert report.first.name == "draft.logits" and not hidden.diverged
    assert AT_NOISE_RATIO < hidden.shift.ratio < FLOOR_RATIO, hidden.shift  # not a shift divergence itself
    causes = [e.cause for e in report.explanations]
    assert causes[0] == "contract.draft_weights" and "lm_head_source" not in causes, causes
    e = report.explanations[0]
    assert e.named_only and e.message.startswith(f"draft_weights.{MLP}: ")
    assert any(line.startswith("draft.hidden_out: inside its tolerance, median row rel") for line in e.evidence)


def test_the_same_fact_is_ruled_out_where_those_rows_are_at_the_noise(tmp_path):
    report = _pair(tmp_path, nudged=False)
    assert report.comparisons["draft.hidden_out"].shift.ratio < AT_NOISE_RATIO
    assert differences_at(report.traces, report.comparisons, "draft.logits", report.contract) == []
    # no known cause, no lm_head guess; only where the rows sit (dataflow_pair moves them from position 1 on:
    # explain/row_structure.py), named, not proven
    assert [(e.cause, e.named_only) for e in report.explanations] == [("position_dependent", True)], \
        report.explanations


@pytest.mark.parametrize("lm_head", [("c" * 64, "d" * 64), ("c" * 64, None)], ids=["differs", "unrecorded"])
def test_the_lm_head_is_still_named_where_the_contract_does_not_prove_it_the_same(tmp_path, lm_head):
    report = _pair(tmp_path, nudged=False, lm_head=lm_head)
    assert [e.cause for e in report.explanations][0] == "lm_head_source"


@pytest.fixture(scope="module")
def drafts(tmp_path_factory, repo_models, run_cli):
    """Training traces of the seed sequences: the shipped draft, and copies whose final norm weight or
    whose lm_head is scaled per element by 1 + 0.3 N(0, 1) (seed 3)."""
    root = tmp_path_factory.mktemp("halves")
    serve = repo_models.parent / "examples" / "seed" / "serve.trace"
    out = {}
    for name, key in (("shipped", None), ("norm", "norm.weight"), ("lm_head", "lm_head.weight")):
        draft = repo_models / "draft"
        if key is not None:
            draft = root / f"draft-{name}"
            shutil.copytree(repo_models / "draft", draft)
            weights = load_file(draft / "model.safetensors")
            w = weights[key].float()
            noise = torch.randn(w.shape, generator=torch.Generator().manual_seed(3))
            weights[key] = (w * (1 + 0.3 * noise)).to(weights[key].dtype)
            save_file(weights, draft / "model.safetensors", metadata={"format": "pt"})
        out[name] = root / f"{name}.trace"
        r = run_cli("record", "train", "--target", repo_models / "target", "--draft", draft, "--replay", serve,
                    "-o", out[name], "--no-noise-floor")
        assert r.exit_code == 0, r.output[-2000:]
    return out


def test_a_draft_with_other_final_norm_weights_is_not_told_its_lm_head_differs(drafts):
    report = diff_traces(str(drafts["shipped"]), str(drafts["norm"]), narrow=False)
    assert report.first is not None and report.first.name.startswith("draft.logits"), report.verdict()
    assert not report.comparisons["draft.hidden_out"].diverged
    causes = [e.cause for e in report.explanations]
    assert "lm_head_source" not in causes, causes
    assert causes[0] == "contract.draft_weights" and report.explanations[0].message.startswith(
        "draft_weights.norm.weight: "), report.explanations[0].message


def test_a_draft_with_another_lm_head_still_is(drafts):
    report = diff_traces(str(drafts["shipped"]), str(drafts["lm_head"]), narrow=False)
    assert report.first is not None and report.first.name.startswith("draft.logits"), report.verdict()
    assert [e.cause for e in report.explanations][0] == "lm_head_source", report.explanations
