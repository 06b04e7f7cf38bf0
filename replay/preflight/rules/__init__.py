"""The pre-flight rules, one module per concern, and ``RULES``: every rule family in the order its
findings are reported, each with when it applies. ``check.run_preflight`` reads the two directories,
resolves what each engine captures, and runs every rule that applies to the ``RuleInputs``.

Modules: ``algorithm`` (--speculative-algorithm), ``aux`` (the SGLang rule, each engine's capture,
the training layers), ``vllm`` (vLLM's own key precedence and numbering), ``weights`` (names,
shapes, dtypes, the served dtype, a tied lm_head), ``vocab`` (d2t / t2d), ``norms``, ``rope``,
``window`` (a config's attention windows), ``tokenizer``; ``wording`` holds the phrases several of them share. Each rule is a pure function of
what ``files`` read and ``engines`` resolved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdiff.eagle3.engines import VLLM
from specdiff.replay.preflight.engines import EngineCapture
from specdiff.replay.preflight.files import DraftInfo, TargetInfo
from specdiff.replay.preflight.report import Finding
from specdiff.replay.preflight.rules.algorithm import check_algorithm
from specdiff.replay.preflight.rules.aux import check_aux, check_training
from specdiff.replay.preflight.rules.layers import check_later_input_norms
from specdiff.replay.preflight.rules.norms import check_norms
from specdiff.replay.preflight.rules.rope import check_rope
from specdiff.replay.preflight.rules.tokenizer import check_tokenizer
from specdiff.replay.preflight.rules.vllm import check_vllm_ids
from specdiff.replay.preflight.rules.vocab import check_vocab
from specdiff.replay.preflight.rules.weights import check_served_dtype, check_tied, check_weights
from specdiff.replay.preflight.rules.window import check_window

__all__ = ["RuleInputs", "Rule", "RULES"]


@dataclass(frozen=True)
class RuleInputs:
    """What the rules read.

    Attributes:
        target / draft: what ``files`` read from the two directories.
        engines: the engines checked ('sglang', 'vllm').
        captures: engine -> what it captures (``engines.resolve_engine_capture``); empty when the
            draft is not an EAGLE-3 checkpoint.
        training_hf: the HF indices the draft was trained on (None: not stated).
        k_weights: the aux slots fc.weight holds (None when the draft is not an EAGLE-3 checkpoint).
        algorithm: the server's --speculative-algorithm (None: not checked).
        served_dtype: the server's --dtype.
        context_length: the server's --context-length (None: derived from the target's config).
    """

    target: TargetInfo
    draft: DraftInfo
    engines: tuple[str, ...]
    captures: dict[str, EngineCapture]
    training_hf: tuple[int, ...] | None
    k_weights: int | None
    algorithm: str | None
    served_dtype: str
    context_length: int | None


@dataclass(frozen=True)
class Rule:
    """One rule family: ``applies`` says when it runs, ``check`` returns its findings."""

    name: str
    applies: Callable[[RuleInputs], bool]
    check: Callable[[RuleInputs], list[Finding]]


def always(_: RuleInputs) -> bool:
    return True


def eagle3_draft(c: RuleInputs) -> bool:
    """The draft is an EAGLE-3 checkpoint (its config and weights can be read as one)."""
    return c.draft.format is not None


def vllm_captured(c: RuleInputs) -> bool:
    """An EAGLE-3 draft checked for vLLM: ``rules.vllm`` is that one engine's own module (its runners' key
    precedence), so the rule names the engine through its spec rather than a column."""
    return eagle3_draft(c) and VLLM.name in c.captures


#: every rule family, in the order its findings are reported (before the sort by severity)
RULES: tuple[Rule, ...] = (
    Rule("algorithm", always,
         lambda c: check_algorithm(c.draft, c.algorithm, target_hidden=c.target.hidden_size)),
    Rule("aux", eagle3_draft,
         lambda c: check_aux(c.captures, raw=c.draft.raw, num_layers=c.target.num_layers,
                             aux_width=c.target.hidden_size, training_hf=c.training_hf,
                             architecture=c.target.architecture)),
    Rule("vllm ids", vllm_captured,
         lambda c: check_vllm_ids(c.captures[VLLM.name], raw=c.draft.raw, num_layers=c.target.num_layers,
                                  k_weights=c.k_weights, training_hf=c.training_hf,
                                  architecture=c.target.architecture)),
    Rule("training layers", eagle3_draft,
         lambda c: check_training(c.captures, c.training_hf, num_layers=c.target.num_layers,
                                  architecture=c.target.architecture)),
    Rule("weights", eagle3_draft, lambda c: check_weights(c.draft, c.target, engines=c.engines)),
    Rule("later layer input norms", eagle3_draft, lambda c: check_later_input_norms(c.draft, engines=c.engines)),
    Rule("vocab map", eagle3_draft,
         lambda c: check_vocab(c.draft.d2t, c.draft.t2d, draft_vocab_size=c.draft.config.draft_vocab_size,
                               vocab_size=c.target.vocab_size, eos_token_ids=c.target.eos_token_ids)),
    Rule("norms", eagle3_draft, lambda c: check_norms(c.draft, engines=c.engines)),
    Rule("rope", eagle3_draft, lambda c: check_rope(c.draft, c.target, context_length=c.context_length)),
    Rule("attention window", eagle3_draft, lambda c: check_window(c.draft, engines=c.engines)),
    Rule("tied lm_head", eagle3_draft, lambda c: check_tied(c.draft, c.target)),
    Rule("served dtype", eagle3_draft, lambda c: check_served_dtype(c.draft, dtype=c.served_dtype)),
    Rule("tokenizer", always, lambda c: check_tokenizer(c.draft, c.target)),
)
