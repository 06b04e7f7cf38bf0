"""Non-finite values and contract differences as the explanation of a first divergence: written as real zarr trace pairs (``TraceWriter``) holding the draft's dataflow —
tokens, three aux slots, ``draft.attn_in`` and ``draft.hidden_out`` at depths 0..1 — where serving
equals training up to bf16-sized noise except for the mistake written in:

- float16 overflow: serving's ``draft.hidden_out`` is inf/NaN on every row where training's values
  pass 65504, serving's contract says ``dtype: float16`` and its weight sha256s are of the float16
  bytes (a cast), training's ``bfloat16``;
- a rope difference: serving's ``draft.hidden_out`` differs at every position but 0 (rope rotates
  position 0 by angle 0), ``draft.attn_in`` equal, and the contract's rope fact differs.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from builders import TracePair

from specdiff.replay.diff.contract.facts import STAGE_CAUSES
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.tracer.schema import STAGE_ORDER, aux_name

H, N_SEQ, T, DEPTHS = 16, 4, 24, 2
BASE = {"hidden_size": H, "draft_hidden_size": H, "num_layers": 8, "aux_hf_indices": [1, 4, 7],
        "dtype": "bfloat16", "rope_theta": 10000.0, "rope_style": "neox", "embed_sha256": "e" * 64,
        "lm_head_sha256": "f" * 64}


def write_pair(root, *, serve_facts: dict, train_facts: dict | None = None, overflow=False, rope_bug=False,
               logits_bug=False, nan_any=False) -> tuple[str, str]:
    """Training and serving traces (module doc); ``*_facts`` are merged into each side's contract."""
    pair = TracePair(root, contract=BASE, train=train_facts, serve=serve_facts)
    rng = pair.rng
    for s in range(N_SEQ):
        toks = rng.integers(0, 1000, T + 1 + DEPTHS)
        aux = rng.standard_normal((3, T, H)).astype(np.float32)
        attn = rng.standard_normal((DEPTHS, T, 2 * H)).astype(np.float32)
        out = rng.standard_normal((DEPTHS, T, H)).astype(np.float32)
        logits = rng.standard_normal((DEPTHS, T, 8)).astype(np.float32)
        if overflow:
            out *= 4e4  # |values| of a few rows per position pass float16's 65504 in training
        for w in pair.sides(s, toks, prompt_len=4):
            noise, side = w.noise, w.serving
            a, at, o, lg = (w.jitter(x, 1e-3) for x in (aux, attn, out, logits))
            if side and overflow:
                big = np.abs(o).max(-1) > 65504
                o[big] = np.inf
                o[big, 0] = np.nan
            if side and nan_any:
                o[0, 5:] = np.nan
            if side and rope_bug:
                o[:, 1:] = o[:, 1:] + 0.3 * noise.standard_normal(o[:, 1:].shape).astype(np.float32)
            if side and logits_bug:
                lg = lg + 0.5 * noise.standard_normal(lg.shape).astype(np.float32)
            pos = np.arange(T)
            w.append("tokens", toks[1:1 + T].astype(np.int64), pos=pos)
            for j in range(3):
                w.append(aux_name(j), a[j], pos=pos)
            for k in range(DEPTHS):
                p = np.arange(T - 1 - k)
                if k:
                    w.append("tokens", toks[1 + k:1 + k + len(p)].astype(np.int64), pos=p, depth=k)
                w.append("draft.attn_in", at[k, p], pos=p, depth=k)
                w.append("draft.hidden_out", o[k, p], pos=p, depth=k)
                w.append("draft.logits", lg[k, p], pos=p, depth=k)
    return pair.close()


FP16 = {"dtype": "float16", "embed_sha256": "1" * 64, "lm_head_sha256": "2" * 64}


def test_fp16_overflow_is_the_explanation_and_the_weight_hashes_are_a_cast(tmp_path):
    a, b = write_pair(tmp_path, serve_facts=FP16, overflow=True)
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.hidden_out"
    cause = report.explanations[0]
    assert cause.cause == "fp16_overflow", [e.cause for e in report.explanations]
    assert cause.tensor == "draft.hidden_out"  # where the non-finite values first appear
    assert "on serving" in cause.message and "serving ran in float16 where the other side ran bfloat16" in cause.message
    assert cause.fix.startswith("serve in bfloat16: --dtype bfloat16")
    assert any("float16's largest finite value is 65504" in line for line in cause.evidence)
    # the weight hashes differ only as bytes of another dtype: info, said as a cast, never "differ"
    weights = {m.field: m for m in report.contract if m.field in ("embed_sha256", "lm_head_sha256")}
    assert set(weights) == {"embed_sha256", "lm_head_sha256"}
    assert all(m.severity == "info" and "the same weights in another dtype (a cast)" in m.message
               for m in weights.values())
    text = render_text(report)
    assert "differ (" not in text.split("acceptance")[0].replace("dtypes differ (", "")
    proc = subprocess.run([sys.executable, "-m", "specdiff.tui", "diff", a, b, "--format", "text", "--no-narrow"],
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "fp16_overflow" in proc.stdout and "--dtype bfloat16" in proc.stdout


def test_nan_without_a_dtype_difference_is_named_with_its_first_row(tmp_path):
    a, b = write_pair(tmp_path, serve_facts={}, nan_any=True)
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.hidden_out"
    cause = report.explanations[0]
    assert cause.cause == "nonfinite"
    assert "first appear at draft.hidden_out depth 0, seq 0 pos 5 on serving" in cause.message


def test_a_weight_difference_in_one_dtype_stays_a_warning(tmp_path):
    a, b = write_pair(tmp_path, serve_facts={"embed_sha256": "1" * 64})
    report = diff_traces(a, b, narrow=False)
    (m,) = [m for m in report.contract if m.field == "embed_sha256"]
    assert m.severity == "warn" and "differ" in m.message


def test_a_dtype_independent_fingerprint_that_differs_proves_other_weights(tmp_path):
    a, b = write_pair(tmp_path, serve_facts={**FP16, "embed_fingerprint": "a" * 64},
                      train_facts={"embed_fingerprint": "b" * 64})
    report = diff_traces(a, b, narrow=False)
    (m,) = [m for m in report.contract if m.field == "embed_sha256"]
    assert m.severity == "warn" and "other weights, not a cast" in m.message
    (lm,) = [m for m in report.contract if m.field == "lm_head_sha256"]
    assert lm.severity == "info" and "a cast" in lm.message


@pytest.mark.parametrize("facts, field", [({"rope_style": "gptj"}, "rope_style"),
                                          ({"rope_theta": 500000.0}, "rope_theta"),
                                          ({"partial_rotary_factor": 0.5}, "partial_rotary_factor")],
                         ids=["style", "theta", "partial"])
def test_a_rope_difference_explains_hidden_out_with_attn_in_equal(tmp_path, facts, field):
    train = {"partial_rotary_factor": 1.0} if field == "partial_rotary_factor" else {}
    a, b = write_pair(tmp_path, serve_facts=facts, train_facts=train, rope_bug=True)
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.hidden_out"
    assert not report.comparisons["draft.attn_in"].diverged
    cause = report.explanations[0]
    assert cause.cause == f"contract.{field}"
    assert "acts inside draft.hidden_out" in cause.message and cause.fix
    assert any(line.startswith("draft.attn_in agrees") for line in cause.evidence)
    text = render_text(report)
    assert f"contract.{field}" in text


def test_a_rope_difference_does_not_explain_a_later_first_divergence(tmp_path):
    """draft.hidden_out agrees: the rope difference cannot be why draft.logits differ."""
    a, b = write_pair(tmp_path, serve_facts={"rope_style": "gptj"}, logits_bug=True)
    report = diff_traces(a, b, narrow=False)
    assert report.first.name == "draft.logits"
    assert not any(e.cause.startswith("contract.rope") for e in report.explanations)


def test_the_cause_table_names_only_stages_and_contract_facts():
    from specdiff.replay.diff.contract.facts import WORDED

    assert set(STAGE_CAUSES) == set(STAGE_ORDER)
    facts = {f for v in STAGE_CAUSES.values() for f in v}
    assert facts <= set(WORDED) | {"aux_dropped_ids"}
