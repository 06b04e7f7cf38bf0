"""Structure is a finding, never a crash: a layout difference between the sides (width, aux slot
count, draft vocab, top-k width, dtype family) at any stage is a divergence of kind ``structure``
at the earliest stage where it shows, with the likely causes, and ``specdiff diff`` exits 1.

Synthetic traces written by the real TraceWriter: every stage of the schema on both sides, one
layout changed on the serving side per case.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.tracer import store
from specdiff.tracer.schema import aux_name, spec_for
from specdiff.tracer.store import TraceWriter
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.view import Sel

H, HD, VD, K, N, TOPK, LTOPK, STEPS = 16, 16, 32, 3, 10, 1, 4, 2
rng = np.random.default_rng(1)
TOKENS = rng.integers(0, 200, size=N + 1)

# A width per schema dim; a case overrides one tensor's dims (or slot count, or dtype family).
DIMS = {"hidden": H, "aux_hidden": K * H, "draft_hidden": HD, "attn_in": 2 * HD, "draft_vocab": VD,
        "topk": TOPK, "logits_topk": LTOPK, "draft_tokens": STEPS + 1, "accept_slots": STEPS + 1}
TENSORS = ["tokens", "target.aux_cat", "draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.attn_in",
           "draft.hidden_out", "draft.logits", "draft.logits_topk.values", "draft.logits_topk.ids",
           "draft.logsumexp", "draft.topk", "draft.topk_target", "verify.draft_tokens", "verify.accept_length"]


def _data(name: str, n: int, *, widths: dict, kind: str, seed: int) -> np.ndarray:
    spec = spec_for(name)
    shape = (n, *(widths.get(d, DIMS[d]) for d in spec.dims))
    r = np.random.default_rng(seed)
    if kind == "float":
        return r.standard_normal(shape).astype(np.float32)
    if kind == "bool":
        return r.random(shape) > 0.5
    return r.integers(0, VD, size=shape).astype(np.int64)


def write_trace(path, *, side: str, slots: int = K, widths: dict | None = None, width_of: str | None = None,
                d2t_rows: int = VD, family_of: str | None = None, monkeypatch=None) -> str:
    """Every stage for one sequence; ``width_of`` gets ``widths`` (the others the defaults).

    ``family_of``: that tensor is written as if the schema declared the other dtype family (a trace
    from another recorder / format version): floats stored as int64 ids, ids as float32.
    """
    contract = {"num_layers": 8, "hidden_size": H, "draft_hidden_size": HD, "draft_vocab_size": VD,
                "aux_hf_indices": [0, 3, 6][:slots] if slots <= 3 else list(range(slots)), "dtype": "float32",
                "spec_steps": STEPS, "spec_topk": TOPK, "logits_topk": LTOPK}
    with TraceWriter(str(path), side=side, contract=contract, overwrite=True) as w:
        sid = w.add_sequence(TOKENS, prompt_len=4, rid="r0")
        pos = np.arange(N)
        for j in range(slots):
            name = aux_name(j)
            wd = (widths or {}) if width_of == "target.aux" else {}
            w.append(name, _data(name, N, widths=wd, kind="float", seed=j), seq=sid, pos=pos)
        for name in TENSORS:
            spec = spec_for(name)
            wd = (widths or {}) if name == width_of else {}
            kind = spec.kind
            if name == family_of:
                kind = "int" if spec.kind == "float" else "float"
                monkeypatch.setattr(store.writer, "spec_for", lambda n, _k=kind, _f=family_of:
                                    replace(spec_for(n), kind=_k) if n == _f else spec_for(n))
            data = TOKENS[1:N + 1] if name == "tokens" and kind == "int" else \
                _data(name, N, widths=wd, kind=kind, seed=hash(name) % 1000)
            w.append(name, data, seq=sid, pos=pos)
            if name == family_of:
                monkeypatch.setattr(store.writer, "spec_for", spec_for)
        w.append("draft.d2t", np.zeros(d2t_rows, np.int64), seq=-1, pos=np.arange(d2t_rows))
    return str(path)


# (tensor the finding must be at, structural kind, how the serving side differs)
CASES = [
    ("target.aux.0", "width", {"width_of": "target.aux", "widths": {"hidden": H + 8}}),
    ("target.aux.2", "slot_count", {"slots": 2}),
    ("target.aux_cat", "width", {"width_of": "target.aux_cat", "widths": {"aux_hidden": H}}),
    ("draft.fc_in", "width", {"width_of": "draft.fc_in", "widths": {"aux_hidden": 2 * H}}),
    ("draft.fc_out", "width", {"width_of": "draft.fc_out", "widths": {"draft_hidden": HD * 2}}),
    ("draft.hidden_in", "width", {"width_of": "draft.hidden_in", "widths": {"draft_hidden": HD * 2}}),
    ("draft.attn_in", "width", {"width_of": "draft.attn_in", "widths": {"attn_in": HD}}),
    ("draft.hidden_out", "width", {"width_of": "draft.hidden_out", "widths": {"draft_hidden": HD + 4}}),
    ("draft.logits", "vocab", {"width_of": "draft.logits", "widths": {"draft_vocab": VD * 2}}),
    ("draft.logits_topk.ids", "topk_width", {"width_of": "draft.logits_topk.ids", "widths": {"logits_topk": 8}}),
    ("draft.topk", "topk_width", {"width_of": "draft.topk", "widths": {"topk": 2}}),
    ("draft.topk_target", "topk_width", {"width_of": "draft.topk_target", "widths": {"topk": 2}}),
    ("draft.d2t", "vocab", {"d2t_rows": VD * 2}),
    ("verify.draft_tokens", "width", {"width_of": "verify.draft_tokens", "widths": {"draft_tokens": 8}}),
] + [(name, "dtype_family", {"family_of": name}) for name in
     ("tokens", "target.aux_cat", "draft.fc_in", "draft.fc_out", "draft.attn_in", "draft.hidden_out",
      "draft.logits", "draft.logits_topk.ids", "draft.topk", "draft.topk_target", "verify.accept_length")]


@pytest.mark.parametrize(("name", "kind", "serve"), CASES, ids=[f"{k}@{n}" for n, k, _ in CASES])
def test_layout_difference_is_a_structure_divergence_at_its_stage(tmp_path, monkeypatch, run_cli, name, kind,
                                                                 serve):
    a = write_trace(tmp_path / "train", side="train")
    b = write_trace(tmp_path / "serve", side="serve", monkeypatch=monkeypatch, **serve)
    report = diff_traces(a, b)
    assert report.first is not None and report.first.kind == "structure", report.verdict()
    assert report.first.name == name and report.first.structure.kind == kind, report.verdict()
    assert report.verdict().startswith(f"first divergence: {name} (structure: {kind.replace('_', ' ')})")
    assert report.explanations, "a structure finding always names its likely causes"
    text = " ".join(render_text(report).split())  # prose wraps at the terminal's width
    assert "no row of it is compared" in text
    result = run_cli("diff", a, b, "--format", "text")
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback: a clean exit 1


def test_same_layouts_have_no_structure_finding(tmp_path):
    a = write_trace(tmp_path / "train", side="train")
    b = write_trace(tmp_path / "serve", side="serve")
    report = diff_traces(a, b)
    assert not [c for c in report.comparisons.values() if c.kind == "structure"]
    assert report.first is None, report.verdict()  # same seeds on both sides: same values too


def test_eagle3_draft_served_as_eagle_names_the_algorithm(tmp_path):
    """SGLang's EAGLE feeds one final hidden state [H]; EAGLE-3 training fed three aux states [3H]."""
    a = write_trace(tmp_path / "train", side="train")
    b = write_trace(tmp_path / "serve", side="serve", slots=1, width_of="target.aux_cat", widths={"aux_hidden": H})
    report = diff_traces(a, b)
    assert report.first.kind == "structure" and report.first.name == "target.aux.1"
    assert report.first.structure.kind == "slot_count"
    cause = report.explanations[0]
    assert cause.cause == "speculative_algorithm"
    assert "--speculative-algorithm EAGLE" in cause.message and f"ONE hidden state {H} wide" in cause.message
    assert "EAGLE3" in cause.fix
    assert any(line.startswith("contract aux_hf_indices: training [0, 3, 6], serving [0]") for line in cause.evidence)


def test_a_draft_scoring_the_target_vocab_is_named(tmp_path):
    a = write_trace(tmp_path / "train", side="train")
    b = write_trace(tmp_path / "serve", side="serve", width_of="draft.logits", widths={"draft_vocab": 200})
    from specdiff.tracer.store import open_trace

    trace_b = open_trace(b)
    trace_b.contract["vocab_size"] = 200  # the target's vocab
    from specdiff.replay.diff.pipeline import diff_opened
    from specdiff.replay.diff.types import Pair

    report = diff_opened(Pair(open_trace(a), trace_b))
    assert report.first.name == "draft.logits" and report.explanations[0].cause == "draft_vocab_size"
    assert "serving's draft scores the whole target vocab (200) where the other side's has 32 ids" in \
        report.explanations[0].message


def test_another_number_of_aux_layers_is_named(tmp_path):
    a = write_trace(tmp_path / "train", side="train")
    b = write_trace(tmp_path / "serve", side="serve", slots=2, width_of="target.aux_cat", widths={"aux_hidden": 2 * H})
    report = diff_traces(a, b)
    assert report.first.structure.kind == "slot_count"
    assert report.explanations[0].cause == "aux_layer_count"
    s = report.first.structure
    assert (s.x, s.y) == (3, 2) and s.fields["aux_hf_indices"] == ([0, 3, 6], [0, 3])


def on_other_tokens(path, out) -> str:
    """A copy of trace ``path`` whose one sequence has other tokens: nothing pairs with it."""
    from specdiff.tracer.store import open_trace

    src = open_trace(str(path))
    with TraceWriter(str(out), side=src.side, contract=src.contract, overwrite=True) as w:
        sid = w.add_sequence(np.arange(4000, 4000 + N + 1), prompt_len=4)
        for name in src.names:
            k = src.keys(name)
            w.append(name, src.read(name), seq=np.where(k["seq"] >= 0, sid, k["seq"]), pos=k["pos"])
    return str(out)


def test_a_structure_finding_survives_traces_that_share_no_sequence(tmp_path):
    a = write_trace(tmp_path / "train", side="train")
    b = write_trace(tmp_path / "serve", side="serve", width_of="draft.fc_out", widths={"draft_hidden": 2 * HD})
    report = diff_traces(a, on_other_tokens(b, tmp_path / "serve-other"))
    assert report.first.name == "draft.fc_out" and report.first.kind == "structure"
    assert "share no token sequence" in report.alignment_error
    assert "no row compared: " in render_text(report)


# ---- the app on a structure finding ------------------------------------------------------------
@pytest.mark.anyio
async def test_a_structure_finding_opens_on_its_row_and_says_why_no_row_is_compared(tmp_path, tui):
    a = write_trace(tmp_path / "train.trace", side="train")
    b = write_trace(tmp_path / "serve.trace", side="serve", slots=1, width_of="target.aux_cat",
                    widths={"aux_hidden": H})
    app = SpecdiffApp(a, b, export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert app.sel == Sel("target.aux.1", 0, 0, 0)
        assert tui.static_text(app, "#verdict").startswith("first divergence: target.aux.1 (structure: slot count)")
        assert "speculative_algorithm" in tui.static_text(app, "#explain-body")
        assert "the layouts differ, so no row is compared" in " ".join(tui.static_text(app, "#detail-body").split())
        await pilot.press("q")
    assert app.return_code == 1


@pytest.mark.anyio
async def test_a_structure_finding_without_any_paired_sequence_still_opens(tmp_path, tui):
    a = write_trace(tmp_path / "train.trace", side="train")
    b = write_trace(tmp_path / "serve.trace", side="serve", width_of="draft.fc_out",
                    widths={"draft_hidden": 2 * HD})
    app = SpecdiffApp(a, on_other_tokens(b, tmp_path / "other.trace"), export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, tui.ready(app))
        assert app.sel == Sel("draft.fc_out", 0, 0, 0)
        assert tui.static_text(app, "#verdict").startswith("first divergence: draft.fc_out (structure: width)")
        await pilot.press("q")
    assert app.return_code == 1
