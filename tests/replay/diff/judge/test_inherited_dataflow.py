"""A row is inherited only along the dataflow: from a tensor that computes it,
never from one it merely follows in stage order, and never from another capture of the target's
forward whose rows the user's loosened fail fraction let through.

The seed pair (traces/examples/seed) captures other HF layers in every aux slot on serving; with
``target.aux.0`` loosened the diff used to say "no divergence", every other tensor "inherited" from
slot 0, ``draft.positions`` (which matches) included. The synthetic pairs (real zarr stores,
``builders.TracePair``) are further instances of the kind: a wrong slot behind a loosened one, and a
rope-position bug behind a loosened slot.
"""

from __future__ import annotations

import json

import numpy as np
from builders import TracePair, moved_rows

from specdiff.replay.diff.judge.inherited import feeds, forward_feeds
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.tracer.schema import aux_name

SEED = ("traces/examples/seed/train.trace", "traces/examples/seed/serve.trace")
H, SEQS, T, DEPTHS = 16, 4, 24, 3


def test_the_graph_follows_the_dataflow_not_the_stage_order():
    assert feeds("target.aux.0", "draft.hidden_out") and feeds("draft.positions", "draft.hidden_out")
    assert feeds("target.aux.2", "target.aux_cat") and feeds("tokens", "draft.attn_in")
    assert not feeds("target.aux.0", "draft.positions")  # rope positions are t + k
    assert not feeds("target.aux.0", "target.aux.1")  # another capture of the forward, not its input
    assert not feeds("draft.logits_topk.values", "draft.logsumexp")  # parallel views of one output
    assert not feeds("draft.hidden_out", "draft.fc_out") and not feeds("target.aux_cat", "target.argmax")
    assert forward_feeds("target.aux.0", "target.aux.1") and forward_feeds("target.aux.1", "target.argmax")
    assert not forward_feeds("target.aux.1", "target.aux.0") and not forward_feeds("target.aux_cat", "target.argmax")


def test_a_loosened_slot_hides_no_other_slot_on_the_seed_pair(run_cli):
    r = run_cli("diff", *SEED, "--tol", "target.aux.0=max_fail_frac:1", "--format", "json")
    assert r.exit_code == 1, r.output[-2000:]
    js = json.loads(r.stdout)
    assert js["first_divergence"]["tensor"] == "target.aux.1"
    assert js["verdict"].startswith("first divergence: target.aux.1 at seq 0 pos 0")
    inherited = js["inherited"]
    # slots 1 and 2 are other HF layers on serving: judged on their own rows, not inherited
    assert "target.aux.1" not in inherited and "target.aux.2" not in inherited
    assert js["tensors"]["target.aux.2"]["diverged"] and js["tensors"]["target.aux.2"]["own_fail_rows"] > 0
    # draft.positions is computed from no hidden state (and matches): never inherited
    assert "draft.positions" not in inherited and js["tensors"]["draft.positions"]["match_rate"] == 1
    # what computes from the loosened slot still inherits from it (decided in judge/inherited.py)
    assert inherited["target.aux_cat"]["from"] == {"target.aux.0": 402}
    assert set(inherited["draft.hidden_out"]["from"]) == {"target.aux.0"}
    # the text report says the same
    text = run_cli("diff", *SEED, "--tol", "target.aux.0=max_fail_frac:1")
    assert text.exit_code == 1 and text.stdout.startswith("first divergence: target.aux.1")
    assert "draft.positions" not in text.stdout.split("inherited rows")[1].split("margin:")[0]


def test_two_loosened_slots_leave_the_third_as_the_first_divergence(run_cli):
    r = run_cli("diff", *SEED, "--tol", "target.aux.0=max_fail_frac:1", "--tol", "target.aux.1=max_fail_frac:1",
                "--format", "json")
    assert r.exit_code == 1, r.output[-2000:]
    js = json.loads(r.stdout)
    assert js["first_divergence"]["tensor"] == "target.aux.2"
    assert "target.aux.2" not in js["inherited"]


def capture_pair(root, *, moved: tuple[str, ...] = (), positions_off: bool = False) -> tuple[str, str]:
    """Training and serving traces of the draft's dataflow at ``SEQS`` x ``T`` positions and ``DEPTHS``
    depths, equal up to bf16-sized noise except: serving's aux slots in ``moved`` hold another layer
    (every row moved by 0.3 of its norm), and ``aux_cat`` and every draft float stage follow them
    (their inputs differ at every position); ``positions_off``: serving's rope positions of every
    depth >= 1 row are one too far (t + k + 1), a draft bug no hidden state causes."""
    contract = {"hidden_size": H, "num_layers": 8, "aux_hf_indices": [1, 4, 7], "dtype": "bfloat16"}
    pair = TracePair(root, contract=contract)
    rng = pair.rng
    draft = ("draft.hidden_in", "draft.attn_in", "draft.hidden_out")
    for s in range(SEQS):
        toks = rng.integers(0, 1000, T + 1 + DEPTHS)
        aux = rng.standard_normal((3, T, H)).astype(np.float32)
        stages = {n: rng.standard_normal((DEPTHS, T, 2 * H if n == "draft.attn_in" else H)).astype(np.float32)
                  for n in draft}
        for w in pair.sides(s, toks, prompt_len=4):
            a = w.jitter(aux)
            d = {n: w.jitter(v) for n, v in stages.items()}
            if w.serving and moved:
                for j in range(3):
                    if aux_name(j) in moved:
                        a[j] = moved_rows(a[j], w.noise)
                d = {n: np.stack([moved_rows(v[k], w.noise) for k in range(DEPTHS)]) for n, v in d.items()}
            pos = np.arange(T)
            w.append("tokens", toks[1:1 + T].astype(np.int64), pos=pos)
            for j in range(3):
                w.append(aux_name(j), a[j], pos=pos)
            w.append("target.aux_cat", np.concatenate(list(a), axis=1), pos=pos)
            for k in range(DEPTHS):
                p = np.arange(T - 1 - k)
                if k:
                    w.append("tokens", toks[1 + k:1 + k + len(p)].astype(np.int64), pos=p, depth=k)
                rope = p + k + (1 if w.serving and positions_off and k else 0)
                w.append("draft.positions", rope.astype(np.int64), pos=p, depth=k)
                for n in draft:
                    w.append(n, d[n][k, p], pos=p, depth=k)
    return pair.close()


def test_a_rope_position_bug_behind_a_loosened_slot_is_the_first_divergence(tmp_path):
    a, b = capture_pair(tmp_path, moved=("target.aux.0",), positions_off=True)
    report = diff_traces(a, b, overrides={"target.aux.0": {"max_fail_frac": 1.0}}, narrow=False)
    assert report.first is not None and report.first.name == "draft.positions", report.verdict()
    assert report.first.divergence_depth == 1
    assert "draft.positions" not in report.inherited()
    assert report.inherited()["draft.hidden_out"]["from"] == {"target.aux.0": SEQS * sum(T - 1 - k for k in range(DEPTHS))}
    # the same pair without the bug: everything downstream inherits, nothing diverges
    clean = diff_traces(*capture_pair(tmp_path / "clean", moved=("target.aux.0",)),
                        overrides={"target.aux.0": {"max_fail_frac": 1.0}}, narrow=False)
    assert clean.first is None, clean.verdict()


def test_a_wrong_slot_behind_a_loosened_slot_is_the_first_divergence(tmp_path):
    a, b = capture_pair(tmp_path, moved=("target.aux.1", "target.aux.2"))
    report = diff_traces(a, b, overrides={"target.aux.1": {"max_fail_frac": 1.0}}, narrow=False)
    assert report.first is not None and report.first.name == "target.aux.2", report.verdict()
    assert report.first.stats["own_fail_rows"] == SEQS * T and "target.aux.2" not in report.inherited()
    assert not report.comparisons["target.aux.0"].diverged
