"""The one table of facts (replay/diff/contract/facts.py): every known fact has its first stage and its own fix,
the fix of a fact that is one kind of replay/diff/causes.py is that kind's, a worded contract field has all its
columns in its one row, and the small table of what is never compared (contract/not_compared.py) holds
provenance and options that do not change the computation, nothing else."""

from __future__ import annotations

import pytest

from specdiff.eagle3.engines import REGISTRY
from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.contract.facts import FACTS, STAGE_CAUSES, WORDED, fact_row
from specdiff.replay.diff.contract.not_compared import not_compared
from specdiff.tracer.schema import STAGE_ORDER


def test_every_row_has_a_stage_and_a_fix():
    for row in FACTS:
        assert row.stage in STAGE_ORDER, row
        assert len(row.fix) > 20, row
    assert len({r.key for r in FACTS}) == len(FACTS)


def test_a_worded_contract_field_is_one_row_with_every_column():
    for field, row in WORDED.items():
        assert fact_row(field) is row, field  # the first row its key matches: no second row for the fact
        assert row.severity in ("error", "warn", "info") and row.message and row.shows, field
        assert all(s == "*" or s in STAGE_ORDER for s in row.shows), field
        # a field with a fix in an engine's own words names a registered engine
        assert set(row.engine_fixes) <= set(REGISTRY), field
    # only worded fields (and the per-side aux-dropped ids) carry a severity's columns
    assert {r.key for r in FACTS if r.message or r.engine_fixes} == set(WORDED)


@pytest.mark.parametrize("key, kind", [("logits_topk", "logits_topk"), ("draft_num_aux", "aux_layer_count"),
                                       ("draft_config.draft_vocab_size", "draft_vocab_size"),
                                       ("draft_unloaded.model.layers.1", "unloaded_params"),
                                       ("target_unloaded.model.layers.0", "unloaded_params")])
def test_a_fact_that_is_a_kind_has_that_kinds_fix(key, kind):
    assert fact_row(key).fix == fix_of(kind)


@pytest.mark.parametrize("key, stage", [
    ("draft_weights.fc.weight", "draft.fc_out"), ("draft_weights.midlayer.self_attn.q_proj.weight", "draft.hidden_out"),
    ("draft_weights.midlayer.hidden_norm.weight", "draft.attn_in"), ("draft_weights.lm_head.weight", "draft.logits"),
    ("draft_weights.d2t", "draft.topk_target"), ("draft_weights.norm.weight", "draft.logits"),
    ("target_weights.model.layers.3", "target.aux"), ("target_weights.lm_head", "verify"),
    ("draft_unloaded.model.layers.1", "draft.hidden_out"), ("draft_unloaded.lm_head", "draft.logits"),
    ("draft_config.num_hidden_layers", "draft.hidden_out"), ("draft_config.rope_parameters.rope_theta", "draft.hidden_out"),
    ("draft_config.rms_norm_eps", "draft.attn_in"), ("engine_options.speculative_draft_window_size", "draft.hidden_out"),
    ("engine_options.kv_cache_dtype", "target.aux"),
    # state no checkpoint holds and what an engine option set (tracer/state_facts.py): named where it acts
    ("target_rope.layers.3", "target.aux"), ("draft_rope.layers.0", "draft.hidden_out"),
    ("target_buffers.model.layers.0.self_attn.rotary_emb.cos_sin_cache", "target.aux"),
    ("draft_buffers.model.layers.0.self_attn.rotary_emb.cos_sin_cache", "draft.hidden_out"),
    ("target_config_overrides.rope_scaling", "target.aux"), ("draft_config_overrides.rope_scaling", "draft.hidden_out"),
    ("draft_input_ids_vocab", "draft.attn_in"),
])
def test_a_fact_acts_first_at_its_stage(key, stage):
    assert fact_row(key).stage == stage


def test_the_stages_a_contract_difference_can_be_proven_inside_start_at_or_after_its_first_stage():
    # STAGE_CAUSES (the rows' ``causes`` by stage) names the facts a difference inside a stage can prove; each
    # of them acts first at that stage or before it (the row's stage), never after
    for stage, facts in STAGE_CAUSES.items():
        for fact in facts:
            assert STAGE_ORDER.index(fact_row(fact).stage) <= STAGE_ORDER.index(stage), (stage, fact)


def test_facts_no_row_lists_are_unlisted():
    assert fact_row("engine_options.some_new_option") is None
    assert fact_row("a_new_recorder_fact") is None


def test_what_is_never_compared_is_provenance_and_options_that_do_not_change_the_computation():
    for key in ("engine_options.port", "engine_options.host", "engine_options.log_level", "engine_options.mem_fraction_static",
                "engine_options.attention_backend", "engine_options.disable_cuda_graph", "engine_version",
                "draft_config._name_or_path", "target_config.transformers_version", "recorder_hook_s",
                "draft_rope_shared"):
        assert not_compared(key), key
    for key in ("engine_options.speculative_draft_window_size", "engine_options.kv_cache_dtype",
                "engine_options.json_model_override_args", "engine_options.some_new_option",
                "draft_config.num_hidden_layers", "draft_config.rope_parameters.rope_theta", "draft_weights.fc.weight",
                "target_weights.model.layers.3", "draft_unloaded.model.layers.1", "a_new_recorder_fact"):
        assert not_compared(key) is None, key
