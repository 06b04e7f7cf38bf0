"""MoE routing near-ties carried by the target's own attention (GPT-OSS): a flip and the
decaying run of later rows it moves are one explained event; a run that does not fade out is not.

Measured on the tiny GPT-OSS target served on the CPU recipe (replay/diff/judge/routing.py module doc):
one layer-0 router near tie (float32 logits 0.0007 apart) moved ``target.aux.1`` at seq 2 pos 13
by rel 0.39 and the next 9 rows by rel 0.050-0.064 (above the 0.05 limit), the row after them
0.047; forcing that single expert choice in a float32 transformers replay reproduced the whole run.
The pairs here are real zarr stores (``TraceWriter``) with that shape written in.
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import TracePair
from builders import moved as _off

from specdiff.replay.diff.judge.routing import ROUTING_MAX_RUN
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.tracer.schema import aux_name

H, N_SEQ, T = 64, 6, 64
MOE = {"target_architecture": "GptOssForCausalLM", "target_num_experts": 4, "target_experts_per_token": 2}
#: the measured run at seq 2: the flip, then what the attention carried (rel per row, pos 13-23)
MEASURED = [0.389, 0.060, 0.064, 0.057, 0.057, 0.056, 0.059, 0.054, 0.055, 0.052, 0.047]


def write_pair(root, moved: dict, repeat: tuple = ()) -> tuple[str, str]:
    """Training and serving traces with ``tokens`` and three aux slots; serving is bf16-sized noise
    off training, and ``moved[(seq, pos)] = rel`` moves serving's ``target.aux.1`` row there by
    ``rel`` (``target.aux.2`` follows it, ``target.aux.0`` agrees). ``repeat``: (seq, first, last)
    stretches whose positions all hold one token (both sides)."""
    base = {"hidden_size": H, "num_layers": 8, "aux_hf_indices": [0, 3, 8], "dtype": "bfloat16"}
    with TracePair(root, contract=base, serve=MOE) as pair:
        for s in range(N_SEQ):
            toks = pair.rng.integers(0, 1000, T + 1)
            for rs, lo, hi in repeat:
                if rs == s:
                    toks[lo:hi + 1] = toks[lo]
            aux = pair.rng.standard_normal((3, T, H)).astype(np.float32)
            for w in pair.sides(s, toks, prompt_len=4):
                a = w.jitter(aux)
                for (ms, t), rel in moved.items():
                    if w.serving and ms == s:
                        a[1, t], a[2, t] = _off(a[1, t], w.noise, rel), _off(a[2, t], w.noise, rel)
                pos = np.arange(T)
                w.append("tokens", toks[1:T + 1].astype(np.int64), pos=pos)
                for j in range(3):
                    w.append(aux_name(j), a[j], pos=pos)
    return pair.paths


def _measured(seq=2, first=13) -> dict:
    return {(seq, first + i): r for i, r in enumerate(MEASURED)}


#: isolated flips elsewhere, as on the served pair (seq 0 pos 1, 4, 21; seq 2 pos 63 was one too)
ISOLATED = {(0, 1): 0.35, (0, 4): 0.30, (0, 21): 0.28, (4, 40): 0.23}


def test_a_flip_and_the_decaying_run_its_attention_carries_are_one_explained_event(tmp_path):
    report = diff_traces(*write_pair(tmp_path, {**ISOLATED, **_measured()}), narrow=False)
    assert report.first is None, report.verdict()  # before: "they form a run of 10 consecutive positions"
    (flip,) = report.legitimate
    assert flip.cause == "moe_routing_near_tie" and flip.tensor == "target.aux.1"
    assert flip.longest_run == 10 > ROUTING_MAX_RUN and flip.events == 5
    assert sorted(r["pos"] for r in flip.rows if r["seq"] == 2) == list(range(13, 23))
    assert "the target's attention carries it to" in flip.message
    # aux.2 moved at the same rows: inherited from aux.1, not a second event
    assert report.inherited()["target.aux.2"]["from"] == {"target.aux.1": 14}


@pytest.mark.parametrize(("case", "moved", "why"), [
    # a bug from position 32 on (e.g. a wrong window) in the sequence of the flip: a flat run
    ("flat", {**_measured(), **{(2, t): 0.08 for t in range(32, 60)}}, "more than 0.5 of it"),
    # the same bug right after a flip, so the run's largest row is the flip's: it lasts to the end
    ("to the end", {(2, 31): 0.39, **{(2, t): 0.08 for t in range(32, T)}}, "no agreeing row of its sequence"),
    # a flip's run that does not fade: its last row is as large as the flip
    ("no decay", {(2, 13): 0.30, **{(2, t): 0.06 for t in range(14, 22)}, (2, 22): 0.29}, "more than 0.5 of it"),
])
def test_a_run_that_does_not_fade_out_is_still_a_divergence(tmp_path, case, moved, why):
    report = diff_traces(*write_pair(tmp_path, {**ISOLATED, **moved}), narrow=False)
    assert report.first is not None and report.first.name == "target.aux.1", (case, report.verdict())
    assert not report.legitimate
    assert why in report.first.stats["routing_not_named"], report.first.stats["routing_not_named"]


#: the measured flat run (tiny GPT-OSS, AVX-512 Xeon, replay/diff/judge/routing.py module doc): three rows of
#: one repeated token at the end of a sequence, each its own layer-4 router near tie
REPEATED = {(3, T - 3): 0.154, (3, T - 2): 0.154, (3, T - 1): 0.155}


def test_a_flat_run_of_one_repeated_token_is_as_many_flips_as_rows(tmp_path):
    # the token repeats from the row before the run (which agrees) to the end of the sequence
    report = diff_traces(*write_pair(tmp_path, {**ISOLATED, **_measured(), **REPEATED}, repeat=((3, T - 4, T),)),
                         narrow=False)
    assert report.first is None, report.verdict()  # before: "they form a run of 3 ... does not fade out"
    (flip,) = report.legitimate
    assert flip.repeated == 3 and flip.longest_run == 10
    assert flip.events == 5 + 3  # the measured flip, four isolated ones, and each repeated row its own
    assert "3 of them repeat one token, each its own near tie" in flip.message


@pytest.mark.parametrize(("case", "repeat"), [
    ("other tokens", ()),
    # one token, but the run's first row holds another: a flip and a tail that does not fade
    ("not one token", ((3, T - 2, T),)),
])
def test_a_flat_run_of_other_tokens_is_still_a_divergence(tmp_path, case, repeat):
    report = diff_traces(*write_pair(tmp_path, {**ISOLATED, **_measured(), **REPEATED}, repeat=repeat), narrow=False)
    assert report.first is not None and report.first.name == "target.aux.1", (case, report.verdict())
    assert "more than 0.5 of it" in report.first.stats["routing_not_named"], report.first.stats["routing_not_named"]


def test_one_repeated_token_failing_on_many_rows_is_still_a_divergence(tmp_path):
    # a bug at a position range over a token the target loops on: longer than ROUTING_MAX_REPEAT, so judged
    # as any run (it does not fade); split row by row it would be more events than routing explains
    moved = {(3, t): 0.08 for t in range(20, T)}
    report = diff_traces(*write_pair(tmp_path, {**ISOLATED, **moved}, repeat=((3, 20, T),)), narrow=False)
    assert report.first is not None and report.first.name == "target.aux.1", report.verdict()
    assert "does not fade out" in report.first.stats["routing_not_named"]


def test_a_longer_flat_run_of_one_repeated_token_is_still_a_divergence(tmp_path):
    """Past ROUTING_MAX_REPEAT rows a flat run of one token is judged as any run: a bug over a looping tail
    (five rows at the measured level to the sequence's end) is not split into near ties."""
    from specdiff.replay.diff.judge.routing import ROUTING_MAX_REPEAT

    flat = {(3, T - k): 0.154 for k in range(1, ROUTING_MAX_REPEAT + 2)}
    report = diff_traces(*write_pair(tmp_path, {**ISOLATED, **_measured(), **flat},
                                     repeat=((3, T - ROUTING_MAX_REPEAT - 2, T),)), narrow=False)
    assert report.first is not None and report.first.name == "target.aux.1", report.verdict()
    assert "more than 0.5 of it" in report.first.stats["routing_not_named"], report.first.stats["routing_not_named"]
