"""One draft config class reads and writes both checkpoint layouts, validates on construction,
names field + file + fix when it cannot, and never fills a computation field in silently.

Real files throughout: config.json written by ``Eagle3DraftConfig.write`` in the SpecForge/SGLang
and the speculators layout, the shipped demo draft (traces/models/draft), the ``specdiff check``
and ``specdiff record train`` CLIs on it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from specdiff.eagle3.norms import NORM_FLAGS, NORMS_OFF
from specdiff.replay.model.draft_config import DraftConfigError, Eagle3DraftConfig, _key_path

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "traces" / "models"
FORMATS = ("specforge", "speculators")
#: the same three layers (HF [0, 4, 6]) in each layout's own convention
IDS = {"specforge": [-1, 3, 5], "speculators": [0, 4, 6]}
CONVENTION = {"specforge": "sglang", "speculators": "speculators"}


def _cfg(**kw) -> Eagle3DraftConfig:
    base = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                vocab_size=128, draft_vocab_size=64, rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None,
                num_aux=3, target_hidden_size=48, **NORMS_OFF)
    base.update(kw)
    return Eagle3DraftConfig(**base)


VARIANTS = {
    "plain": {},
    "norm_before_fc+norm_output": {"norm_before_fc": True, "norm_output": True},
    "fc_norm+norm_before_residual": {"fc_norm": True, "norm_before_residual": True},
    "llama3_rope_mha_head_dim": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                 "num_key_value_heads": 4, "head_dim": 16},
    "lm_head_from_target": {"draft_vocab_size": 128, "lm_head_from_target": True},
    # the rope keys SGLang 0.5.23 reads beyond theta / scaling (llama.py:199, :335)
    "partial_rotary_gptj": {"partial_rotary_factor": 0.5, "rope_is_neox_style": False},
    "tied": {"tie_word_embeddings": True},
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_config_written_in_either_layout_reads_back_the_same(tmp_path, fmt, variant):
    cfg = _cfg(**VARIANTS[variant])
    f = cfg.write(tmp_path, fmt, aux_ids=IDS[fmt], torch_dtype="bfloat16", verifier="/models/target")
    back = Eagle3DraftConfig.from_file(tmp_path)
    assert back.settings() == {**cfg.settings(), "eagle_aux_hidden_state_layer_ids": IDS[fmt],
                               "aux_convention": CONVENTION[fmt]}
    assert (back.format, back.source) == (fmt, str(f))
    # every computation field is in the file, except the flags SpecForge would misread when false
    # and draft_vocab_size when the lm_head comes from the target (SGLang's signal for it)
    unwritten = {n for n in ("norm_output", "norm_before_residual") if not getattr(cfg, n)} if fmt == "specforge" else set()
    unwritten |= {"draft_vocab_size"} if cfg.lm_head_from_target else set()
    assert set(back.defaults_used) == unwritten
    raw = json.loads(f.read_text())
    if fmt == "speculators":
        assert raw["transformer_layer_config"]["hidden_size"] == 32 and raw["architectures"] == ["Eagle3DraftModel"]
        assert raw["speculators_config"]["verifier"]["name_or_path"] == "/models/target"
    else:
        assert raw["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": IDS[fmt]}
        assert raw["architectures"] == ["LlamaForCausalLMEagle3"]
    assert ("draft_vocab_size" in raw) is not cfg.lm_head_from_target


def test_speculators_layout_refuses_both_fc_norms_and_says_which_layout_serves_them(tmp_path):
    cfg = _cfg(norm_before_fc=True, fc_norm=True)
    with pytest.raises(DraftConfigError) as e:
        cfg.write(tmp_path, "speculators", aux_ids=None, torch_dtype="float32")
    assert e.value.field == "fc_norm" and "write the specforge format" in e.value.fix
    cfg.write(tmp_path, "specforge", aux_ids=None, torch_dtype="float32")
    assert Eagle3DraftConfig.from_file(tmp_path).norm_flags() == {**NORMS_OFF, "norm_before_fc": True,
                                                                  "fc_norm": True}


#: field -> (a value other than the default, the default an engine gives an absent key)
DEFAULTED = {
    "num_key_value_heads": (2, 4), "head_dim": (16, 8), "rms_norm_eps": (1e-5, 1e-6), "rope_theta": (500000.0, 10000.0),
    "rope_scaling": ({"type": "linear", "factor": 2.0}, None), "hidden_act": None, "target_hidden_size": (48, 32),
    "num_aux": (2, 3), "draft_vocab_size": (64, 128),
    **{name: (True, False) for name in NORM_FLAGS},
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(DEFAULTED))
def test_a_computation_field_missing_from_the_file_takes_the_engine_value_and_says_so(tmp_path, caplog, fmt, name):
    if name == "hidden_act":  # only silu is implemented: absent = silu, the LlamaConfig default
        given, want = "silu", "silu"
    else:
        given, want = DEFAULTED[name]
    cfg = _cfg(**{name: given})
    f = cfg.write(tmp_path, fmt, aux_ids=None if name == "num_aux" else IDS[fmt][:cfg.num_aux],
                  torch_dtype="float32")
    raw = json.loads(f.read_text())
    key = _key_path(fmt, name)
    holder = raw["transformer_layer_config"] if key.startswith("transformer_layer_config.") else raw
    del holder[key.rsplit(".", 1)[-1]]
    if name == "num_aux":
        raw.pop("eagle_config", None)
        raw.pop("eagle_aux_hidden_state_layer_ids", None)
    f.write_text(json.dumps(raw))
    with caplog.at_level(logging.INFO, logger="specdiff.replay.model.draft_config"):
        back = Eagle3DraftConfig.from_file(tmp_path)
    assert getattr(back, name) == want
    entry = back.defaults_used[name]
    assert entry["value"] == want and entry["source"].startswith(f"absent from {f}: ")
    assert any(f"draft config default: {name} = {want!r}" in r.getMessage() for r in caplog.records)
    if name == "draft_vocab_size":
        assert back.lm_head_from_target  # SGLang llama_eagle3.py:306-308


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                                  "num_hidden_layers"])
def test_a_missing_dim_is_an_error_naming_the_field_the_file_and_the_fix(tmp_path, fmt, name):
    f = _cfg().write(tmp_path, fmt, aux_ids=IDS[fmt], torch_dtype="float32")
    raw = json.loads(f.read_text())
    (raw["transformer_layer_config"] if fmt == "speculators" else raw).pop(name)
    f.write_text(json.dumps(raw))
    with pytest.raises(DraftConfigError) as e:
        Eagle3DraftConfig.from_file(tmp_path)
    key = name if fmt == "specforge" else f"transformer_layer_config.{name}"
    assert (e.value.field, e.value.file) == (key, str(f))
    assert str(e.value) == f"draft config {f}: {key}: is missing; fix: {e.value.fix}" and e.value.fix


@pytest.mark.parametrize("edit,field,words", [
    ({"num_hidden_layers": 0}, "num_hidden_layers", "positive integer"),
    ({"hidden_act": "gelu"}, "hidden_act", 'use "silu"'),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "divisor of num_attention_heads"),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling", "none, linear or llama3"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling", "original_max_position_embeddings"),
    ({"partial_rotary_factor": 2.0}, "partial_rotary_factor", "(0, 1]"),
    ({"rope_is_neox_style": "no"}, "rope_is_neox_style", "true or false"),
    ({"architectures": ["LlamaForCausalLM"]}, "architectures", "LlamaForCausalLMEagle3"),
    ({"fc_norm": "yes"}, None, None),  # truthy as SGLang reads it: not an error
    # values of the wrong type were tracebacks (ValueError, TypeError, AttributeError)
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": "2,5,6"}}, "eagle_config.eagle_aux_hidden_state_layer_ids",
     "write a JSON list of integers, e.g. [2, 5, 6]"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": 5}}, "eagle_config.eagle_aux_hidden_state_layer_ids",
     "e.g. [2, 5, 6]"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [None, 2]}},
     "eagle_config.eagle_aux_hidden_state_layer_ids", "JSON list of integers"),
    ({"eagle_config": "x"}, "eagle_config", "give an object"),
    ({"hidden_size": "256"}, "hidden_size", "positive integer"),
    ({"rope_scaling": "linear"}, "rope_scaling", "give an object"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "x"}}, "rope_scaling", "factor a positive number"),
    ({"rope_theta": "abc"}, "rope_theta", "positive number"),
])
def test_a_wrong_value_is_refused_on_construction_with_field_file_and_fix(tmp_path, edit, field, words):
    f = _cfg().write(tmp_path, "specforge", aux_ids=IDS["specforge"], torch_dtype="float32")
    f.write_text(json.dumps({**json.loads(f.read_text()), **edit}))
    if field is None:
        assert Eagle3DraftConfig.from_file(tmp_path).fc_norm is True
        return
    with pytest.raises(DraftConfigError) as e:
        Eagle3DraftConfig.from_file(tmp_path)
    assert e.value.field == field and e.value.file == str(f) and words in e.value.fix


def test_a_config_built_in_code_is_validated_too():
    with pytest.raises(DraftConfigError, match=r"\(built in code\): num_aux: is 0; fix: give a positive integer"):
        _cfg(num_aux=0)
    with pytest.raises(TypeError, match="norm_output"):  # computation fields have no default
        Eagle3DraftConfig(**{k: v for k, v in _cfg().settings().items() if k != "norm_output"})


def test_the_shipped_demo_draft_loads_unchanged_and_lists_the_flags_it_leaves_out():
    from specdiff.replay.model.checkpoint import load_draft

    cfg = Eagle3DraftConfig.from_file(MODELS / "draft")
    assert (cfg.hidden_size, cfg.num_aux, cfg.target_hidden_size, cfg.draft_vocab_size) == (256, 3, 256, 1024)
    assert cfg.norm_flags() == NORMS_OFF and not cfg.lm_head_from_target
    assert set(cfg.defaults_used) == {*NORM_FLAGS, "rope_scaling"}  # the file names neither
    assert load_draft(MODELS / "draft").config.settings() == cfg.settings()



def test_check_on_a_draft_config_missing_a_field_is_one_error_line_with_field_file_and_fix(tmp_path, run_cli):
    draft = tmp_path / "draft"
    shutil.copytree(MODELS / "draft", draft)
    raw = json.loads((draft / "config.json").read_text())
    del raw["intermediate_size"]
    (draft / "config.json").write_text(json.dumps(raw))
    r = run_cli("check", "--target", str(MODELS / "target"), "--draft", str(draft))
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdiff: error: ")
    assert f"{draft / 'config.json'}: intermediate_size: is missing; fix: add intermediate_size" in lines[0]


def test_record_train_prints_and_stores_the_draft_config_defaults(tmp_path, run_cli):
    from specdiff.tracer.contract_fields import DEFAULTS_USED
    from specdiff.tracer.store import open_trace

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "def f(x):"}\n')
    out = tmp_path / "train.trace"
    r = run_cli("record", "train", "--target", str(MODELS / "target"), "--draft", str(MODELS / "draft"),
              "--prompts", str(prompts), "-o", str(out), "--steps", "1", "--dtype", "float32",
              "--probe-positions", "0")
    assert r.exit_code == 0, r.output
    used = open_trace(str(out)).contract[DEFAULTS_USED]
    src = f"absent from {MODELS / 'draft' / 'config.json'}: off (SGLang 0.5.23 srt/models/llama_eagle3.py:173-182"
    assert used["draft_config.norm_before_fc"]["value"] is False
    assert used["draft_config.norm_before_fc"]["source"].startswith(src)
    assert {f"draft_config.{n}" for n in NORM_FLAGS} <= set(used)
    line = next(x for x in r.output.splitlines() if x.startswith("defaults used: "))
    assert "draft_config.norm_before_fc False (absent from " in line


def test_tie_word_embeddings_is_read_with_a_note_not_refused(tmp_path):
    """SGLang 0.5.23 serves a tied draft (its lm_head becomes the target's embedding,
    llama_eagle3.py:303-304 + llama.py:917-918): the config says so instead of refusing."""
    f = _cfg().write(tmp_path, "specforge", aux_ids=IDS["specforge"], torch_dtype="float32")
    f.write_text(json.dumps({**json.loads(f.read_text()), "tie_word_embeddings": True}))
    cfg = Eagle3DraftConfig.from_file(tmp_path)
    assert cfg.tie_word_embeddings is True
    assert any("tie_word_embeddings is true" in n and "target's embedding" in n for n in cfg.notes)


def test_absent_rope_keys_are_the_engines_values_without_a_default_entry(tmp_path):
    f = _cfg().write(tmp_path, "specforge", aux_ids=IDS["specforge"], torch_dtype="float32")
    raw = json.loads(f.read_text())
    assert "partial_rotary_factor" not in raw and "rope_is_neox_style" not in raw
    cfg = Eagle3DraftConfig.from_file(tmp_path)
    assert (cfg.partial_rotary_factor, cfg.rope_is_neox_style, cfg.rotary_dim) == (1.0, True, 8)
    assert not {"partial_rotary_factor", "rope_is_neox_style"} & set(cfg.defaults_used)
