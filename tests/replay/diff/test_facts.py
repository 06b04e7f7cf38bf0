"""The one table of facts (replay/diff/facts.py): every known fact has its first stage and its own fix,
the fix of a fact that is one kind of replay/diff/causes.py is that kind's, and the small table of what
is never compared holds provenance and options that do not change the computation, nothing else."""

from __future__ import annotations

import pytest

from specdiff.replay.diff.causes import fix_of
from specdiff.replay.diff.explain.contract_check import _FIELDS, ENGINE_FIXES
from specdiff.replay.diff.facts import FACTS, fact_row, not_compared
from specdiff.tracer.schema import STAGE_ORDER


def test_every_row_has_a_stage_and_a_fix():
    for row in FACTS:
        assert row.stage in STAGE_ORDER, row
        assert len(row.fix) > 20, row
    assert len({r.key for r in FACTS}) == len(FACTS)


def test_every_worded_contract_field_takes_its_fix_from_the_table():
    for field in _FIELDS:
        row = fact_row(field)
        assert row is not None and row.key == field, field
    # the engine's own wording overrides only fields the table holds
    assert {f for fixes in ENGINE_FIXES.values() for f in fixes} <= set(_FIELDS)


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
])
def test_a_fact_acts_first_at_its_stage(key, stage):
    assert fact_row(key).stage == stage


def test_the_stages_a_contract_difference_can_be_proven_inside_start_at_or_after_its_first_stage():
    # explain/contract.py STAGE_CAUSES names the facts a difference inside a stage can prove; each of them
    # acts first at that stage or before it (the fact table's stage), never after
    from specdiff.replay.diff.explain.contract import STAGE_CAUSES

    for stage, facts in STAGE_CAUSES.items():
        for fact in facts:
            assert STAGE_ORDER.index(fact_row(fact).stage) <= STAGE_ORDER.index(stage), (stage, fact)


def test_facts_no_row_lists_are_unlisted():
    assert fact_row("engine_options.some_new_option") is None
    assert fact_row("a_new_recorder_fact") is None


def test_what_is_never_compared_is_provenance_and_options_that_do_not_change_the_computation():
    for key in ("engine_options.port", "engine_options.host", "engine_options.log_level", "engine_options.mem_fraction_static",
                "engine_options.attention_backend", "engine_options.disable_cuda_graph", "engine_version",
                "draft_config._name_or_path", "target_config.transformers_version", "recorder_hook_s"):
        assert not_compared(key), key
    for key in ("engine_options.speculative_draft_window_size", "engine_options.kv_cache_dtype",
                "engine_options.json_model_override_args", "engine_options.some_new_option",
                "draft_config.num_hidden_layers", "draft_config.rope_parameters.rope_theta", "draft_weights.fc.weight",
                "target_weights.model.layers.3", "draft_unloaded.model.layers.1", "a_new_recorder_fact"):
        assert not_compared(key) is None, key
