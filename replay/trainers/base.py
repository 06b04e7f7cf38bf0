"""What every trainer adapter gives ``record train``: a draft that ``TrainReplayer`` drives like the
reference ``Eagle3Draft`` (``ttt_forward``, ``d2t``, ``hot_token_id``, ``parameters``), and the
training-side contract facts of that trainer."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from specdiff.eagle3.vocab_map import hot_token_ids
from specdiff.replay.model.draft_model import TTTOutput

__all__ = ["TrainerDraft", "unloaded_parameters"]


def unloaded_parameters(model: nn.Module, written: Iterable[str], provided: Iterable[str] = ()) -> list[str]:
    """The trainer model's parameters no checkpoint file wrote (``written``: the file tensor names its
    loader read, in the trainer's own naming) and nothing else ``provided`` (the verifier's embedding,
    a copy specdiff made): left as the trainer initialised them. Read off the live module, so a loader
    that silently drops a key is seen (the contract's ``draft_unloaded``)."""
    skip = set(written) | set(provided)
    return [n for n, _ in model.named_parameters() if n not in skip]


class TrainerDraft:
    """A trainer's draft module wrapped for ``TrainReplayer``.

    Attributes:
        model: the trainer's own module (eval).
        trainer / version / cls: trainer name, installed package version, the class built.
        variants: fact name -> value where this trainer computes something the reference's default
            does not (recorded in the contract as ``trainer_variants``); empty when it agrees.
        notes: plain-words remarks for the trace's notes.
        config: what the trainer's own config of the loaded draft says (``trainer_config``; {}
            when the adapter reads none).
        unloaded: the trainer model's parameters that neither the checkpoint nor the verifier gave a
            value (left as the trainer initialised them; the contract's ``draft_unloaded``), or None
            where the adapter cannot tell (then the reference load's list stands).
        layer_input_norms: ``tracer.weight_facts.layer_input_norms`` of the trainer's own model (the
            contract's ``draft_layer_input_norms``), or None: the reference's stands (one layer).
    """

    def __init__(self, model: nn.Module, *, trainer: str, version: str, variants: dict | None = None,
                 notes: list[str] | None = None, config: dict | None = None, unloaded: list[str] | None = None,
                 layer_input_norms: dict[str, str] | None = None):
        self.model = model
        self.layer_input_norms = layer_input_norms
        self.unloaded = None if unloaded is None else sorted(unloaded)
        self.trainer, self.version = trainer, version
        self.cls = f"{type(model).__module__}.{type(model).__qualname__}"
        self.variants = dict(variants or {})
        self.notes = list(notes or [])
        self.config = dict(config or {})

    @property
    def d2t(self) -> torch.Tensor:
        """int64 [Vd] draft -> target offsets, the trainer model's own buffer."""
        return self.model.d2t

    def hot_token_id(self) -> torch.Tensor:
        """int64 [Vd]: draft id -> target id, ``d2t + arange`` (specdiff.eagle3.vocab_map)."""
        return hot_token_ids(self.d2t)

    def parameters(self):
        return self.model.parameters()

    def facts(self) -> dict:
        """Training-side contract facts: who computed the forward."""
        return {"engine": self.trainer, "engine_version": self.version, "trainer": self.trainer,
                "trainer_version": self.version, "trainer_class": self.cls,
                "trainer_variants": dict(self.variants), "trainer_config": dict(self.config),
                **({} if self.unloaded is None else {"draft_unloaded": list(self.unloaded)}),
                **({} if self.layer_input_norms is None else {"draft_layer_input_norms": self.layer_input_norms})}

    def ttt_forward(self, aux_cat: torch.Tensor, input_ids: torch.Tensor, steps: int = 1, *,
                    lengths: torch.Tensor | None = None, pad_id: int = 0) -> TTTOutput:
        """The trainer's teacher-forced TTT forward over a right-padded batch, read by hooks;
        arguments and result as ``Eagle3Draft.ttt_forward``."""
        raise NotImplementedError
