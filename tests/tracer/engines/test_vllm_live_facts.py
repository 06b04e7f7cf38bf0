"""vLLM's draft config as contract fact (tracer/engines/vllm/live_facts.py): vLLM wraps an EAGLE draft's config
in an ``EAGLEConfig`` whose ``model`` holds the Llama config; the fact is flat like the draft's config.json, so
it compares key by key with training's (a correct pair showed ``model_type`` 'eagle' vs 'llama' and every key
under ``model.`` on one side only before). No vLLM needed: a stand-in with the same shape."""

from __future__ import annotations

from transformers import LlamaConfig

from specdiff.tracer.engines.vllm.live_facts import _draft_config


class EagleConfigLike:
    """vLLM 0.32 transformers_utils/configs/eagle.py ``EAGLEConfig``: ``model`` plus the outer keys."""

    model_type = "eagle"

    def __init__(self, inner, **outer):
        self.model, self.outer = inner, outer

    def to_dict(self):
        return {"model": self.model.to_dict(), "model_type": "eagle", "architectures": ["Eagle3LlamaForCausalLM"],
                **self.outer}


def test_the_wrapped_draft_config_is_flat_with_the_inner_keys_winning():
    inner = LlamaConfig(hidden_size=256, num_hidden_layers=1, architectures=["LlamaForCausalLMEagle3"])
    fact = _draft_config(EagleConfigLike(inner, eagle_aux_hidden_state_layer_ids=[0, 3, 6], truncated_vocab_size=4096))
    assert "model" not in fact
    assert fact["model_type"] == "llama" and fact["architectures"] == ["LlamaForCausalLMEagle3"]
    assert fact["hidden_size"] == 256 and fact["eagle_aux_hidden_state_layer_ids"] == [0, 3, 6]
    assert _draft_config(inner)["model_type"] == "llama"  # not wrapped: as it is


def test_a_multi_layer_drafts_earlier_layer_outputs_are_named_unrecorded_with_the_compiled_reason():
    """vLLM builds num_hidden_layers decoder layers inside the compiled LlamaModel (llama_eagle3.py:198-208):
    draft.layer_out.{i} for i < N-1 cannot be hooked and says so (the diff then marks it unobserved, not
    missing); a one-layer draft has none."""
    from specdiff.tracer.engines.options import Options
    from specdiff.tracer.engines.vllm.contract import unrecorded_stages

    three = unrecorded_stages(Options(path="x"), {"draft_config": {"num_hidden_layers": 3}})
    assert [n for n in three if n.startswith("draft.layer_out")] == ["draft.layer_out.0", "draft.layer_out.1"]
    assert "torch.compiled" in three["draft.layer_out.1"]
    one = unrecorded_stages(Options(path="x"), {"draft_config": {"num_hidden_layers": 1}})
    assert not any(n.startswith("draft.layer_out") for n in one)
