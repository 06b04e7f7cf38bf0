"""The trainers' own forwards (replay/trainers, ``record train --trainer``) against specdiff's
reference forward, on the shipped draft (traces/models) and the same sequences: every stage at
every TTT depth. A test skips only when the trainer's package is not installed (``make install``
installs both); none needs a server."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from builders import specforge_exported_draft  # noqa: E402

from specdiff.demo.data import load_sequences  # noqa: E402
from specdiff.replay.diff.compare import blocks  # noqa: E402
from specdiff.replay.diff.pipeline import diff_traces  # noqa: E402
from specdiff.replay.diff.report import render_text  # noqa: E402
from specdiff.replay.record.record_train import load_train_side  # noqa: E402
from specdiff.replay.record.replayer import TrainReplayer  # noqa: E402
from specdiff.replay.record.sequences import TrainSequence  # noqa: E402
from specdiff.replay.trainers import registry  # noqa: E402
from specdiff.replay.trainers.registry import TRAINERS, load_trainer_draft, trainer_version  # noqa: E402
from specdiff.replay.trainers.speculators import ROPE_POSITION_OFFSET  # noqa: E402
from specdiff.tracer.store import open_trace  # noqa: E402
from specdiff.tui.cmd_record_train import TRAINER_NAMES  # noqa: E402

torch.set_num_threads(2)
STEPS = 3
STAGES = ("tokens", "positions", "hidden_in", "attn_in", "hidden_out", "logits")
#: fp32: the two forwards differ only in summation order (measured: max |diff| <= 1e-6 of the stage's scale)
FP32_REL = 1e-5


def _need(name: str) -> None:
    if trainer_version(name) is None:
        pytest.skip(f"{name} is not installed ({TRAINERS[name].pip}; make install does it)")


def _fp32_side(repo_models, draft: str):
    """The reference train side of ``traces/models/<draft>`` in fp32, and one right-padded batch of six
    shipped sequences of different lengths (40 .. 15 tokens: padding and its masks are exercised),
    target captured."""
    side = load_train_side(repo_models / "target", repo_models / draft, steps=STEPS, dtype="float32",
                           probe_positions=0)
    seqs = [TrainSequence(np.asarray(t[: 40 - 5 * i], np.int64), 4)
            for i, t in enumerate(load_sequences(repo_models / "data")[:6])]
    ids, lengths = TrainReplayer.pad(seqs)
    cap, _ = side.replayer.forward(ids, lengths)
    return side, ids, lengths, cap


@pytest.fixture(scope="module")
def fp32_side(repo_models):
    """The shipped one-layer draft's fp32 side (``_fp32_side``)."""
    return _fp32_side(repo_models, "draft")


@pytest.fixture(scope="module")
def fp32_side_2l(repo_models):
    """The two-layer demo draft's fp32 side (``traces/models/draft2l``)."""
    if not (repo_models / "draft2l" / "config.json").exists():
        pytest.skip("the two-layer demo draft is not built (traces/models/draft2l)")
    return _fp32_side(repo_models, "draft2l")


def _scaled_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["specforge", "speculators"])
def test_trainer_forward_equals_reference_at_every_stage_and_depth(fp32_side, repo_models, trainer):
    _need(trainer)
    _assert_trainer_equals_reference(trainer, fp32_side, repo_models)


@pytest.mark.slow
def test_speculators_forward_of_a_two_layer_draft_equals_reference_at_every_stage_and_depth(fp32_side_2l,
                                                                                             repo_models):
    """A two-layer SGLang-format draft (``traces/models/draft2l``): speculators' later layer is a plain
    decoder layer normalising its input with ``input_layernorm`` (models/eagle3/core.py:81-94) where
    SGLang 0.5.23 normalises it with ``hidden_norm`` (llama_eagle3.py:97-105); speculators' converter
    carries ``layers.1.input_layernorm`` (a norm SGLang never reads) over. Loaded with the weight SGLang
    computes with, speculators computes the reference's function; the load names the mapping."""
    _need("speculators")
    draft = _assert_trainer_equals_reference("speculators", fp32_side_2l, repo_models)
    side = fp32_side_2l[0]
    assert torch.equal(draft.model.layers[1].input_layernorm.weight.float(),
                       side.loaded.model.layers["1"].hidden_norm.weight.float())
    assert any("layers.1.hidden_norm" in n for n in draft.notes), draft.notes
    assert draft.unloaded == [] and draft.facts()["draft_unloaded"] == []


def test_speculators_parameters_no_file_gave_are_the_trainers_draft_unloaded(fp32_side_2l, repo_models,
                                                                              monkeypatch):
    """Without specdiff's copy of the later layers, speculators' model keeps layer 1 as it initialised it
    (its converter drops ``layers.1.*``): the training side's ``draft_unloaded`` is read off the trainer's
    own model and names every one of them, not the reference load's empty list."""
    _need("speculators")
    from specdiff.replay.trainers import speculators

    monkeypatch.setattr(speculators, "_later_layers", lambda model, reference: (set(), []))
    side = fp32_side_2l[0]
    draft = load_trainer_draft("speculators", target_dir=repo_models / "target", loaded=side.loaded,
                               dtype=torch.float32, device="cpu", aux_hf_indices=side.aux.hf_indices)
    names = [n for n, _ in side.loaded.model.layers["1"].named_parameters()]
    want = sorted(f"layers.1.{'input_layernorm.weight' if n == 'hidden_norm.weight' else n}" for n in names)
    assert draft.facts()["draft_unloaded"] == want and len(want) == 9


def test_specforge_draft_unloaded_is_read_off_its_model(fp32_side, repo_models, monkeypatch):
    """SpecForge's module names are the file's: every parameter is loaded (the embedding from the target);
    an embedding neither the draft nor the target gives is named as left as SpecForge initialised it."""
    _need("specforge")
    side = fp32_side[0]
    kw = dict(target_dir=repo_models / "target", loaded=side.loaded, dtype=torch.float32, device="cpu")
    assert side.loaded.model.embed_source == "target"
    assert load_trainer_draft("specforge", **kw).facts()["draft_unloaded"] == []
    monkeypatch.setattr(side.loaded.model, "embed_source", "random")
    assert load_trainer_draft("specforge", **kw).facts()["draft_unloaded"] == ["embed_tokens.weight"]


def _assert_trainer_equals_reference(trainer, fp32_side, repo_models):
    """The trainer's forward vs the reference's on ``fp32_side`` at every stage and depth (fp32 within
    ``FP32_REL`` of scale; tokens, validity and greedy ids equal; positions the reference's plus the
    trainer's recorded offset). Returns the trainer draft."""
    side, ids, lengths, cap = fp32_side
    draft = load_trainer_draft(trainer, target_dir=repo_models / "target", loaded=side.loaded, dtype=torch.float32,
                               device="cpu", aux_hf_indices=side.aux.hf_indices)
    out = draft.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
    offset = draft.variants.get("rope_position_offset", 0)
    ref = side.loaded.model.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
    # the embedding both use is the target's (speculators' loader alone can leave it uninitialised)
    assert torch.equal(draft.model.embed_tokens.weight.float(), side.loaded.model.embed_tokens.weight.float())
    v0 = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    for name in ("fc_in", "fc_out"):
        err = _scaled_err(getattr(out, name)[v0], getattr(ref, name)[v0])
        assert err <= FP32_REL, f"{trainer} {name}: {err:.2e}"
    for k in range(STEPS):
        v = ref.valid[k]
        assert torch.equal(out.valid[k], v)
        assert torch.equal(out.tokens[k][v], ref.tokens[k][v]), f"{trainer} tokens depth {k}"
        # the trainer's recorded variant, not a silent difference: its rope positions are the reference's + offset
        assert torch.equal(out.positions[k][v], ref.positions[k][v] + offset), f"{trainer} positions depth {k}"
        for name in ("hidden_in", "attn_in", "hidden_out", "logits"):
            err = _scaled_err(getattr(out, name)[k][v], getattr(ref, name)[k][v])
            assert err <= FP32_REL, f"{trainer} {name} depth {k}: {err:.2e}"
        assert torch.equal(out.logits[k][v].argmax(-1), ref.logits[k][v].argmax(-1))
        # a multi-layer draft's earlier layers, each at its own output (draft.layer_out.{i})
        assert len(out.layer_out[k]) == len(ref.layer_out[k]) == side.loaded.config.num_hidden_layers - 1
        for i, (a, b) in enumerate(zip(out.layer_out[k], ref.layer_out[k], strict=True)):
            err = _scaled_err(a[v], b[v])
            assert err <= FP32_REL, f"{trainer} layer_out.{i} depth {k}: {err:.2e}"
    return draft


@pytest.mark.slow
def test_speculators_windowed_layers_compute_the_references_prefix_rule(fp32_side, repo_models):
    """A sliding-attention draft (window 4 over sequences of 15-40 rows): speculators' own masks
    (models/eagle3/attention.py:16-19, the depth-0 block reused at every TTT step) and the reference's
    ``prefix`` rule agree at every stage and depth; the window really acts (the full-attention reference
    differs); SGLang's ``kv`` rule (``--draft-window``) and SpecForge are refused in one line."""
    _need("speculators")
    import dataclasses

    from specdiff.replay.trainers.errors import RecordTrainError

    side, ids, lengths, cap = fp32_side
    loaded, saved = side.loaded, side.loaded.config
    kw = dict(target_dir=repo_models / "target", dtype=torch.float32, device="cpu", aux_hf_indices=side.aux.hf_indices)
    try:
        loaded.config = loaded.model.config = dataclasses.replace(saved, attention_windows=(4,))
        draft = load_trainer_draft("speculators", loaded=loaded, **kw)
        assert draft.model.sliding_window == 5 and draft.model.sliding_window_indices == [0]
        out = draft.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
        ref = loaded.model.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
        loaded.model.config = saved
        full = loaded.model.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
        for k in range(STEPS):
            v = ref.valid[k]
            for name in ("hidden_out", "logits"):
                err = _scaled_err(getattr(out, name)[k][v], getattr(ref, name)[k][v])
                assert err <= FP32_REL, f"{name} depth {k}: {err:.2e}"
            assert _scaled_err(full.hidden_out[k][v], ref.hidden_out[k][v]) > 100 * FP32_REL, k
        loaded.config = loaded.model.config = dataclasses.replace(saved, attention_windows=(4,), window_distance="kv")
        for trainer, says in (("speculators", "counted by the 'kv' rule"), ("specforge", "attention windows [4]")):
            if trainer_version(trainer) is None:
                continue
            with pytest.raises(RecordTrainError, match=re.escape(says)) as e:
                load_trainer_draft(trainer, loaded=loaded, **kw)
            assert "\n" not in str(e.value)
    finally:
        loaded.config = loaded.model.config = saved


@pytest.mark.slow
def test_speculators_offset_is_its_only_difference(fp32_side, repo_models):
    """speculators rotates at t + k + 1 (models/eagle3/data.py:35); the reference given that offset
    computes the same values too (rope is relative: the offset moves no attention score beyond fp32
    noise)."""
    _need("speculators")
    side, ids, lengths, cap = fp32_side
    draft = load_trainer_draft("speculators", target_dir=repo_models / "target", loaded=side.loaded,
                               dtype=torch.float32, device="cpu", aux_hf_indices=side.aux.hf_indices)
    assert draft.variants == {"rope_position_offset": ROPE_POSITION_OFFSET}
    out = draft.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
    ref = side.loaded.model.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths, position_offset=ROPE_POSITION_OFFSET)
    for k in range(STEPS):
        v = ref.valid[k]
        assert torch.equal(out.positions[k][v], ref.positions[k][v])
        assert _scaled_err(out.logits[k][v], ref.logits[k][v]) <= FP32_REL


@pytest.fixture(scope="module")
def recorded(repo_models, tmp_path_factory, run_cli):
    """``record train`` of the seed serving trace's sequences (bf16, the serving dtype) by each
    installed trainer, through the CLI: trainer name -> (trace path, CLI result)."""
    out = tmp_path_factory.mktemp("trainers")
    seed = repo_models.parent / "examples" / "seed" / "serve.trace"
    traces = {}
    for name in TRAINER_NAMES:
        if TRAINERS[name] is not None and trainer_version(name) is None:
            continue
        path = out / f"{name}.trace"
        res = run_cli("record", "train", "--target", repo_models / "target", "--draft", repo_models / "draft",
                      "--replay", seed, "-o", path, "--trainer", name)
        traces[name] = (path, res)
    return traces


@pytest.mark.slow
def test_specforge_training_trace_has_no_divergence_from_the_reference(recorded):
    _need("specforge")
    (sf, res), (ref, _) = recorded["specforge"], recorded["specdiff"]
    assert res.exit_code == 0, res.output
    assert "Set draft model" not in res.stdout  # SpecForge's print goes to stderr: stdout is the report
    c = open_trace(str(sf)).contract
    assert (c["trainer"], c["trainer_version"], c["engine"]) == ("specforge", trainer_version("specforge"), "specforge")
    assert c["trainer_class"].endswith("LlamaForCausalLMEagle3") and c["trainer_variants"] == {}
    report = diff_traces(str(sf), str(ref), narrow=False)
    assert report.first is None, report.first.name
    assert set(report.comparisons) >= {"draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.attn_in",
                                       "draft.positions", "draft.hidden_out", "draft.logits_topk.values",
                                       "draft.logsumexp", "draft.topk_target"}
    assert not any(t.diverged for t in report.comparisons.values())


@pytest.mark.slow
def test_speculators_training_trace_differs_from_the_reference_only_by_its_rope_offset(recorded, monkeypatch):
    """speculators' bf16 training (fp32 weights under autocast, train/trainer.py:539-545) against the
    reference's bf16: every value stage within the pair's tolerance; draft.positions agrees once the
    recorded variant (rope positions + 1, compare/blocks.py RECORDED_SHIFTS) is removed, and the
    report says it was."""
    _need("speculators")
    (sp, res), (ref, _) = recorded["speculators"], recorded["specdiff"]
    assert res.exit_code == 0, res.output
    c = open_trace(str(sp)).contract
    assert (c["trainer"], c["engine"]) == ("speculators", "speculators")
    assert c["trainer_variants"]["rope_position_offset"] == 1
    assert "autocast" in c["trainer_variants"]["compute"]
    assert any("rope positions start at 1" in n for n in c["notes"])
    report = diff_traces(str(sp), str(ref), narrow=False)
    assert report.first is None, report.first.name
    positions = report.comparisons["draft.positions"]
    assert positions.stats["recorded_shift"] == [1, 0] and positions.stats["match_rate"] == 1.0, positions.stats
    assert "draft.positions" in render_text(report) and "recorded shifts +1/+0 removed" in render_text(report)
    # read without the recorded fact, the same rows are the position_offset mistake: the shift was all
    monkeypatch.setattr(blocks, "RECORDED_SHIFTS", {})
    report = diff_traces(str(sp), str(ref), narrow=False)
    assert report.first is not None and report.first.name == "draft.positions"
    assert [e.cause for e in report.explanations][:1] == ["position_offset"]


def test_missing_trainer_package_is_one_line_naming_the_pip_command(run_cli, repo_models, tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "trainer_version", lambda name: None)
    out = tmp_path / "t.trace"
    res = run_cli("record", "train", "--target", repo_models / "target", "--draft", repo_models / "draft",
                  "--prompts", tmp_path / "p.jsonl", "-o", out, "--trainer", "speculators")
    assert res.exit_code == 2, res.output
    assert "pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


def test_cli_trainer_names_are_the_registry():
    assert TRAINER_NAMES == tuple(TRAINERS)


@pytest.mark.slow
def test_specforge_loop_is_online_eagle3_model_forward(fp32_side, repo_models):
    """The loop ``SpecForgeDraft.ttt_forward`` runs (without SpecForge's triton loss) records exactly
    what SpecForge's own ``OnlineEagle3Model.forward`` computes (algorithms/eagle3/model.py:244-443),
    its loss and metric terms stubbed out (they need a GPU; no stage depends on them)."""
    _need("specforge")
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.utils import padding

    from specdiff.replay.trainers import specforge as sf
    from specdiff.replay.trainers.stages import StageHooks

    side, ids, lengths, cap = fp32_side
    draft = load_trainer_draft("specforge", target_dir=repo_models / "target", loaded=side.loaded,
                               dtype=torch.float32, device="cpu")
    mine = draft.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
    online = OnlineEagle3Model(draft.model, length=STEPS, attention_backend="sdpa")
    zero = torch.zeros(())
    online._acc_and_loss = lambda **_: (zero,) * 7
    B, T = ids.shape
    mask = torch.arange(T)[None, :] < lengths[:, None]
    hooks = StageHooks(draft.model, sf._PATHS, positions=("midlayer.self_attn", sf._rope_positions))
    with torch.no_grad(), torch.compiler.set_stance("force_eager"), hooks:
        online(input_ids=padding(ids, left=False), attention_mask=mask, loss_mask=mask.long()[..., None],
               target=torch.zeros(B, T, side.loaded.config.vocab_size), hidden_states=cap.aux_cat.float())
    real = hooks.output(lengths, draft.d2t)
    assert torch.equal(mine.fc_in, real.fc_in) and torch.equal(mine.fc_out, real.fc_out)
    for name in STAGES:
        for k, (a, b) in enumerate(zip(getattr(mine, name), getattr(real, name), strict=True)):
            v = mine.valid[k]
            assert torch.equal(a[v], b[v]), f"{name} depth {k}"


@pytest.mark.slow
def test_speculators_format_draft_recorded_by_speculators_and_by_the_reference(repo_models, tmp_path, run_cli):
    """The shipped draft written in speculators' own format by speculators' converter
    (convert/eagle/eagle3_converter.py), then recorded by speculators (loaded directly, no conversion)
    and by the reference: the same values but the recorded rope offset; speculators' config is in the
    contract (trainer_config)."""
    _need("speculators")
    from loguru import logger
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    logger.disable("speculators")
    draft = tmp_path / "speculators-draft"
    Eagle3Converter().convert(str(repo_models / "draft"), str(draft), base_model=str(repo_models / "target"),
                              validate=False, eagle_aux_hidden_state_layer_ids=[1, 3, 6])
    seed = repo_models.parent / "examples" / "seed" / "serve.trace"
    traces = {}
    for name in ("speculators", "specdiff"):
        traces[name] = tmp_path / f"{name}.trace"
        res = run_cli("record", "train", "--target", repo_models / "target", "--draft", draft, "--replay", seed,
                      "-o", traces[name], "--trainer", name)
        assert res.exit_code == 0, res.output
    c = open_trace(str(traces["speculators"])).contract
    assert c["draft_format"] == "speculators"
    cfg = c["trainer_config"]
    assert (cfg["algorithm"], cfg["speculative_tokens"], cfg["verifier"]) == ("eagle3", 3, str(repo_models / "target"))
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6] and cfg["norm_before_residual"] is False
    report = diff_traces(str(traces["speculators"]), str(traces["specdiff"]), narrow=False)
    assert not any(t.diverged for t in report.comparisons.values()), report.first
    assert report.comparisons["draft.positions"].stats["recorded_shift"] == [1, 0]


def test_specforge_refuses_a_draft_its_class_cannot_hold_in_one_line(fp32_side, repo_models):
    """SpecForge's draft has a 3-slot fc, no input_norm and a pre-norm residual
    (llama3_eagle.py:1625, 1654-1700): such a draft is refused naming each reason, not loaded into a
    model that would compute something else."""
    _need("specforge")
    import dataclasses

    from specdiff.replay.trainers.errors import RecordTrainError

    side = fp32_side[0]
    cfg = dataclasses.replace(side.loaded.config, norm_before_fc=True, norm_before_residual=True)
    loaded = dataclasses.replace(side.loaded, config=cfg)
    with pytest.raises(RecordTrainError) as e:
        load_trainer_draft("specforge", target_dir=repo_models / "target", loaded=loaded, dtype=torch.float32,
                           device="cpu")
    msg = str(e.value)
    assert "norm_before_fc" in msg and "norm_before_residual" in msg and "\n" not in msg


@pytest.mark.slow
def test_two_trainers_traces_differ_in_no_contract_fact_for_their_trainer_facts(recorded):
    """trainer / trainer_version / trainer_class / trainer_config / trainer_variants are provenance
    (replay/diff/contract/facts.py NOT_COMPARED): what they change is compared as the stages (draft.positions)."""
    _need("specforge")
    _need("speculators")
    report = diff_traces(str(recorded["specforge"][0]), str(recorded["speculators"][0]), narrow=False)
    assert report.contract == [], report.contract
    assert report.first is None and report.comparisons["draft.positions"].stats["recorded_shift"] == [0, 1]


def test_a_specforge_exported_draft_is_the_draft_it_was_exported_from(repo_models, tmp_path, run_cli):
    """SpecForge 0.2.0's own exporter (specforge/export/to_sglang.py ``export_to_sglang``: a training
    state ``{"strategy": "eagle3", "draft_state_dict": ...}`` -> ``save_pretrained`` + legacy rope keys) on
    the shipped draft's weights: specdiff reads the exported directory as the same draft (every setting,
    every tensor bit for bit, the config's extra keys such as bos_token_id ignored), `check` passes it for
    SGLang, and ``--trainer specforge`` loads it."""
    _need("specforge")
    from safetensors.torch import load_file

    from specdiff.replay.model.checkpoint import load_draft

    sd = load_file(str(repo_models / "draft" / "model.safetensors"))
    out = specforge_exported_draft(repo_models / "draft", tmp_path / "exported")
    shipped, exported = load_draft(repo_models / "draft"), load_draft(out)
    assert exported.config.settings() == shipped.config.settings()
    assert exported.weights_sha256 == shipped.weights_sha256
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
    res = run_cli("check", "--target", repo_models / "target", "--draft", out, "--engine", "sglang")
    assert res.exit_code == 0, res.output
    draft = load_trainer_draft("specforge", target_dir=repo_models / "target", loaded=exported, dtype=torch.float32,
                               device="cpu")
    assert draft.trainer == "specforge"


def test_attach_recorder_on_speculators_own_two_layer_model_records_each_layers_output(fp32_side_2l, repo_models,
                                                                                        tmp_path):
    """A user's own loop (``attach_recorder``, README "Record from your own training loop") on speculators'
    real two-layer ``Eagle3DraftModel`` running its own packed forward: the auto adapter reads layer 0's output
    at layer 1's input norm (``input_layernorm``, speculators' plain decoder layer) and writes it as
    ``draft.layer_out.0``, row for row the reference's within fp32 summation noise; ``draft.hidden_out`` is the
    last layer's."""
    _need("speculators")
    from specdiff.tracer.store import TraceWriter
    from specdiff.tracer.training_hooks import attach_recorder

    side, ids, lengths, cap = fp32_side_2l
    draft = load_trainer_draft("speculators", target_dir=repo_models / "target", loaded=side.loaded,
                               dtype=torch.float32, device="cpu", aux_hf_indices=side.aux.hf_indices)
    w = TraceWriter(str(tmp_path / "hooks.trace"), side="train")
    rec = attach_recorder(draft.model, w, logits="none")
    assert rec.adapter == "speculators" and rec.name_map["layer_out.0"] == "layers.1.input_layernorm"
    rec.batch(list(range(len(lengths))), lengths, packed=True)
    draft.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)  # speculators' forward on the packed batch
    rec.detach()
    w.close()
    with torch.no_grad():
        ref = side.loaded.model.ttt_forward(cap.aux_cat, ids, STEPS, lengths=lengths)
    tr = open_trace(str(tmp_path / "hooks.trace"))
    for name, want in (("draft.layer_out.0", [lo[0] for lo in ref.layer_out]), ("draft.hidden_out", ref.hidden_out)):
        k, got = tr.keys(name), torch.as_tensor(tr.read(name, as_float32=True))
        assert sorted(set(k["depth"].tolist())) == list(range(STEPS)), name
        exp = torch.stack([want[d][s, p] for s, p, d in zip(k["seq"], k["pos"], k["depth"], strict=True)])
        assert len(k["seq"]) == sum(int(v.sum()) for v in ref.valid), name  # every defined row, no other
        assert _scaled_err(got, exp) < FP32_REL, name
