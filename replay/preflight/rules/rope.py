"""The rope rules: every rope key SGLang 0.5.23 reads for the draft against the target's, and the
draft's context against the served one (``preflight.engines.sglang_context_length``).
"""

from __future__ import annotations

import json

from specdiff.replay.preflight.engines import sglang_context_length
from specdiff.replay.preflight.files import DraftInfo, TargetInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_rope"]


def _scaling_key(s):
    return json.dumps(s, sort_keys=True) if s else None


def _draft_dims(draft: DraftInfo) -> dict:
    """The config dict holding the draft's Llama dims (speculators: transformer_layer_config)."""
    inner = draft.raw.get("transformer_layer_config")
    return inner if isinstance(inner, dict) else draft.raw


def check_rope(draft: DraftInfo, target: TargetInfo, *, context_length: int | None = None) -> list[Finding]:
    """Every rope key SGLang 0.5.23 reads for the draft (srt/models/llama.py:199-200, :324-336):
    rope_theta and rope_scaling against the target's, rope_is_neox_style, partial_rotary_factor, and
    the draft's context (max_position_embeddings) against the served one (``context_length``: the
    server's --context-length; None = what SGLang derives from the target's config)."""
    cfg = draft.config
    out = []
    if float(cfg.rope_theta) != float(target.rope_theta):
        out.append(Finding("rope.theta", "warn", "all",
                           f"draft rope_theta {cfg.rope_theta:g} but target rope_theta {target.rope_theta:g}: "
                           "the engines rotate draft positions with the draft's value",
                           f"set the draft rope_theta to what training used (usually the target's, "
                           f"{target.rope_theta:g})"))
    if _scaling_key(cfg.rope_scaling) != _scaling_key(target.rope_scaling):
        out.append(Finding("rope.scaling", "warn", "all",
                           f"draft rope_scaling {cfg.rope_scaling} but target rope_scaling {target.rope_scaling}",
                           "copy the target's rope_scaling into the draft config if training used it"))
    if not cfg.rope_is_neox_style:
        out.append(Finding("rope.style", "warn", "sglang",
                           "draft rope_is_neox_style false: SGLang 0.5.23 rotates the draft's q/k in interleaved "
                           "pairs (2i, 2i+1) (gptj style; llama.py:335, layers/rotary_embedding/utils.py:52-62) "
                           "instead of halves (neox, what Llama-style trainers such as SpecForge use)",
                           "remove rope_is_neox_style from the draft config (or set it true) unless the draft was "
                           "trained with interleaved rope"))
    if cfg.partial_rotary_factor != 1.0:
        out.append(Finding("rope.partial_rotary", "warn", "sglang",
                           f"draft partial_rotary_factor {cfg.partial_rotary_factor:g}: SGLang 0.5.23 rotates only "
                           f"the first {cfg.rotary_dim} of each head's {cfg.head_dim} dims (llama.py:199-200); the "
                           "other dims carry no position",
                           "remove partial_rotary_factor from the draft config unless training rotated the same "
                           "dims (record train replays the config as SGLang serves it)"))
    served = context_length or sglang_context_length(target.config.get("text_config") or target.config)
    own = sglang_context_length(_draft_dims(draft))
    if own < served:
        out.append(Finding("rope.max_positions", "error", "sglang",
                           f"draft max_position_embeddings {cfg.max_position_embeddings} (context {own}) < the "
                           f"served context {served}: SGLang 0.5.23 refuses to start (ValueError: \"Target model's "
                           "context_length ... is greater than the derived context_length\", "
                           "srt/configs/model_config.py:1314; the draft gets the target's context, "
                           "speculative/eagle_worker_v2.py:229) unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, "
                           "which overrides the draft's max_position_embeddings to the target's "
                           "(model_config.py:1303-1311)",
                           f"set max_position_embeddings = {served} in the draft config (rope does not depend on "
                           "it), or start the server with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"))
        out.append(Finding("rope.max_positions", "warn", "vllm",
                           f"draft max_position_embeddings {cfg.max_position_embeddings} < the served context "
                           f"{served}: positions past it are beyond what the draft config declares",
                           f"set max_position_embeddings = {served} in the draft config"))
    return out
