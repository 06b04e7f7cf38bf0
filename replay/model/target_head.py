"""The few target tensors a draft's training needs when the target itself does not run: its config, input
embedding, final norm and lm_head, read by name from the target's weight files (no decoder layer is built).

This is what both trainers load for offline training on stored features: SpecForge 0.2.0 reads the target's
lm_head for its target head and the embedding for the draft (``allow_missing_warm_start_embedding``,
algorithms/eagle3/providers.py; its ``uses_external_target_head``), speculators 0.9.0 copies the verifier's
``norm`` and ``lm_head`` into ``verifier_norm`` / ``verifier_lm_head`` (models/eagle3/core.py:33-41, :119-120)
and applies them to the stored last hidden state (:248-253). ``record train --features`` uses them for the
same three things: the draft's embedding when its checkpoint has none (SGLang shares the target's), and the
target's greedy token at every position (``target.argmax``, the TTT labels) from the stored last hidden state.

The final norm is the Llama-family RMSNorm (transformers 5.19 ``LlamaRMSNorm``: float32 ``x * rsqrt(mean(x^2)
+ eps)``, cast back, times the weight), which Qwen2/3, Qwen3-MoE and DeepSeek-V2/V3 share; a target whose
config says another norm is refused where the norm is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdiff.replay.model.target_capture import TargetError

__all__ = ["TargetHead", "load_target_head"]

#: checkpoint names of each tensor, first match wins (HF Llama-style, and a VL wrapper's language model)
_NAMES = {
    "embed": ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
              "language_model.model.embed_tokens.weight"),
    "lm_head": ("lm_head.weight", "language_model.lm_head.weight"),
    "norm": ("model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight"),
}
#: model_type values whose final norm is the Llama RMSNorm (module doc)
RMS_NORM_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "mistral", "kimi_k2")


class TargetHead(torch.nn.Module):
    """The target's embedding, final norm and lm_head, with its transformers config (``.config``), in the
    checkpoint's dtype. Exposes ``get_input_embeddings`` / ``get_output_embeddings`` as a transformers model
    does (replay/model/target_capture.py reads them so). ``specdiff_missing_keys`` is [] (every tensor it
    holds came from the checkpoint)."""

    def __init__(self, config, embed: torch.Tensor, lm_head: torch.Tensor, norm: torch.Tensor | None,
                 *, sources: dict[str, str]):
        super().__init__()
        self.config = config
        self.embed_tokens = torch.nn.Embedding(*embed.shape, _weight=embed.clone(), _freeze=True)
        self.lm_head = torch.nn.Linear(lm_head.shape[1], lm_head.shape[0], bias=False, dtype=lm_head.dtype)
        self.lm_head.weight = torch.nn.Parameter(lm_head.clone(), requires_grad=False)
        self.norm_weight = None if norm is None else torch.nn.Parameter(norm.clone(), requires_grad=False)
        self.sources = dict(sources)
        self.specdiff_missing_keys: list[str] = []

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The target's final RMSNorm of ``x`` [..., H] (module doc), in ``x``'s dtype.

        Raises:
            TargetError: no norm weight was read (the target's model_type is not an RMSNorm family).
        """
        if self.norm_weight is None:
            raise TargetError(f"the target's final norm was not read (model_type {self.config.model_type!r} is not "
                              f"one of {', '.join(RMS_NORM_TYPES)}, whose norm specdiff computes)")
        eps = float(getattr(self.config, "rms_norm_eps", 1e-6))
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return self.norm_weight.to(x.dtype) * h.to(x.dtype)

    @torch.no_grad()
    def logits(self, last_hidden: torch.Tensor, *, prenorm: bool) -> torch.Tensor:
        """The target's logits [..., V] from its last hidden state [..., H] (after the final norm, or before it
        when ``prenorm``), in the lm_head's dtype as a transformers forward computes them."""
        w = self.lm_head.weight
        h = last_hidden.to(w.device)
        h = self.final_norm(h) if prenorm else h
        return torch.nn.functional.linear(h.to(w.dtype), w)


def _weight_index(d: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it, for a model directory's safetensors (index or headers) or .bin files."""
    index = d / "model.safetensors.index.json"
    if index.is_file():
        return {k: d / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    out: dict[str, Path] = {}
    from safetensors import safe_open

    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            out.update(dict.fromkeys(sf.keys(), f))
    if not out:
        for f in sorted(d.glob("*.bin")):
            out.update(dict.fromkeys(torch.load(str(f), map_location="cpu", weights_only=True, mmap=True), f))
    return out


def _read(f: Path, name: str) -> torch.Tensor:
    if f.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as sf:
            return sf.get_tensor(name)
    return torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)[name]


def load_target_head(path: str | Path, *, need_norm: bool) -> TargetHead:
    """The target's ``TargetHead`` read from the directory ``path`` (its config.json and weight files).

    Args:
        need_norm: read the final norm too (the stored last hidden state is before it).

    Raises:
        TargetError: no config.json, a config transformers cannot read, no embedding tensor, or (with
            ``need_norm``) a norm family specdiff does not compute or no norm tensor (one line each).
    """
    from transformers import AutoConfig

    d = Path(path)
    if not (d / "config.json").is_file():
        raise TargetError(f"{d}: no config.json (a local Hugging Face model directory is needed)")
    try:
        config = AutoConfig.from_pretrained(str(d), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - one line
        raise TargetError(f"cannot read the target config of {d}: {type(e).__name__}: {e}") from None
    where = _weight_index(d)
    found = {k: next((n for n in names if n in where), None) for k, names in _NAMES.items()}
    if found["embed"] is None:
        raise TargetError(f"{d}: no input embedding among its weights (looked for {', '.join(_NAMES['embed'])})")
    embed = _read(where[found["embed"]], found["embed"])
    sources = {"embed": found["embed"]}
    if found["lm_head"] is not None:
        lm_head, sources["lm_head"] = _read(where[found["lm_head"]], found["lm_head"]), found["lm_head"]
    elif getattr(config.get_text_config(), "tie_word_embeddings", False):
        lm_head, sources["lm_head"] = embed, f"{found['embed']} (tie_word_embeddings)"
    else:
        raise TargetError(f"{d}: no lm_head among its weights and tie_word_embeddings is false")
    norm = None
    if need_norm:
        kind = getattr(config.get_text_config(), "model_type", None)
        if kind not in RMS_NORM_TYPES:
            raise TargetError(f"{d}: model_type {kind!r}: the stored last hidden state is before the final norm, and "
                              f"specdiff computes that norm for {', '.join(RMS_NORM_TYPES)} only")
        if found["norm"] is None:
            raise TargetError(f"{d}: no final norm among its weights (looked for {', '.join(_NAMES['norm'])})")
        norm, sources["norm"] = _read(where[found["norm"]], found["norm"]), found["norm"]
    return TargetHead(config, embed, lm_head, norm, sources=sources)
