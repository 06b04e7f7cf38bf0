"""Run a HF Llama target and capture the aux hidden states EAGLE-3 feeds its draft.

HF ``output_hidden_states[i]``: i = 0 is the embedding output, i in 1..L-1 the output of decoder
layer i-1, i = L is after the final norm. The last decoder layer's output *before* the
final norm, which no HF index holds, is what SGLang 0.5.23's GPT-OSS captures at index L
(srt/models/gpt_oss.py:726-738), vLLM at id L and SpecForge's HF backend at id L-1: a slot given
as ``prenorm`` is read from the final norm's input by a forward pre-hook. The slots are
concatenated in the order given, as a trainer does (SpecForge 0.2.0 ``generate_eagle3_data`` concatenates its list in list
order); an engine's ascending order is the caller's to pass (``specdiff.eagle3.aux_layers``). The
default dtype is bf16, the serving dtype, which keeps the tolerances tight: SGLang 0.5.23's bf16 aux
rows (CPU, tiny 8-layer target) differ from HF bf16 by rel 3-4e-3 and from HF fp32 by 5-6e-3.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdiff.tracer.errors import SpecdiffError

__all__ = ["TargetError", "TargetCapture", "load_target", "capture_target", "target_embedding",
           "target_lm_head", "target_num_layers", "final_norm"]


class TargetError(SpecdiffError):
    """A target model that cannot be loaded or captured (one clear line)."""


def load_target(path: str | Path, *, dtype: torch.dtype = torch.bfloat16, device_map: str | None = None):
    """Load a local HF causal LM (e.g. LlamaForCausalLM) in eval mode, offline. The parameters the
    checkpoint did not provide (transformers' ``missing_keys``: it initialises them) are kept, sorted,
    as the model's ``specdiff_missing_keys`` (the contract's ``target_unloaded``). ``device_map``: passed to
    ``from_pretrained`` as given (``auto`` spreads the target over the devices accelerate sees); None: not passed."""
    from transformers import AutoModelForCausalLM
    path = Path(path)
    if not (path / "config.json").is_file():
        raise TargetError(f"{path}: no config.json (a local Hugging Face model directory is needed)")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, local_files_only=True, output_loading_info=True,
            **({"device_map": device_map} if device_map is not None else {}))
    except Exception as e:
        raise TargetError(f"cannot load target {path}: {type(e).__name__}: {e}") from None
    model.specdiff_missing_keys = sorted(info.get("missing_keys") or ())
    return model.eval()


def target_num_layers(model) -> int:
    """L, the target's decoder layer count."""
    return int(model.config.num_hidden_layers)


def target_embedding(model) -> torch.Tensor:
    """The target's input embedding weight [V, H] (what SGLang shares with the draft)."""
    return model.get_input_embeddings().weight.detach()


def target_lm_head(model) -> torch.Tensor:
    """The target's lm_head weight [V, H]."""
    return model.get_output_embeddings().weight.detach()


def final_norm(model) -> torch.nn.Module:
    """The target's final norm (``model.get_decoder().norm``: Llama, Qwen2/3, Qwen3-MoE,
    DeepSeek-V2/V3 and GPT-OSS all name it ``norm`` in transformers 5.19); its input is the last
    decoder layer's output before the norm.

    Raises:
        TargetError: the decoder has no module ``norm`` (the class is named).
    """
    get = getattr(model, "get_decoder", None)
    decoder = get() if callable(get) else getattr(model, "model", None)
    norm = getattr(decoder, "norm", None)
    if not isinstance(norm, torch.nn.Module):
        raise TargetError(f"{type(model).__name__}: no final norm module (decoder .norm) to read the last layer's "
                          "pre-norm output from")
    return norm


@dataclass
class TargetCapture:
    """Target-side tensors for B sequences of T positions.

    Attributes:
        input_ids: int64 [B,T] (right-padded).
        lengths: int64 [B].
        hf_indices: captured HF hidden_states indices in concat order (slot j = hf_indices[j]).
        prenorm: entries L of ``hf_indices`` whose slot holds the last layer's pre-norm output.
        aux: per slot [B,T,H] in the run dtype (``target.aux.{j}``).
        aux_cat: [B,T,K*H], the slots concatenated in ``hf_indices`` order (``target.aux_cat``).
        argmax: int64 [B,T], the target's greedy next token after position t (``target.argmax``).
        hidden_states: every HF hidden state [L+1] x [B,T,H] when ``keep_all`` (layer probes).
        logits_top: (values float32 [B,T,k], ids int64 [B,T,k]): the k largest logits after position
            t, descending (``target.logits_topk.*``; k = ``top_logits``, None when 0).
    """

    input_ids: torch.Tensor
    lengths: torch.Tensor
    hf_indices: tuple[int, ...]
    aux: list[torch.Tensor]
    aux_cat: torch.Tensor
    argmax: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    prenorm: tuple[int, ...] = ()
    logits_top: tuple[torch.Tensor, torch.Tensor] | None = None


@torch.no_grad()
def capture_target(model, input_ids: torch.Tensor, hf_indices, *, lengths: torch.Tensor | None = None,
                   keep_all: bool = False, prenorm=(), top_logits: int = 0) -> TargetCapture:
    """Run ``model`` on ``input_ids`` [B,T] (right-padded to ``lengths``) and capture aux slots.

    Args:
        hf_indices: HF hidden_states indices to capture, in concat order, used as given (resolve
            tool ids with ``specdiff.eagle3.aux_layers.resolve_aux_ids``).
        keep_all: also return every hidden state.
        prenorm: ``()`` or ``(L,)``: the slot listed as L holds the last decoder layer's output
            before the final norm (the final norm's input, ``final_norm``), [B,T,H] in the run
            dtype, instead of ``hidden_states[L]`` (after the norm).
        top_logits: k of ``TargetCapture.logits_top`` (0: none).

    Raises:
        TargetError: an index outside 0..L, an index given twice, a ``prenorm`` entry other than
            L or not among ``hf_indices``, a target without a final norm module.
    """
    L = target_num_layers(model)
    idx = tuple(int(i) for i in hf_indices)
    pre = tuple(sorted({int(i) for i in prenorm}))
    bad = [i for i in idx if not 0 <= i <= L]
    if bad:
        raise TargetError(f"aux HF indices {bad} outside 0..{L} for a {L}-layer target")
    if len(set(idx)) != len(idx):
        raise TargetError(f"aux HF indices {list(idx)} name a layer twice; each slot must be a different layer")
    if pre and (pre != (L,) or L not in idx):
        raise TargetError(f"pre-norm slots {list(pre)}: only index L = {L}, listed in the aux indices {list(idx)}, "
                          "is the last layer's output before the final norm")
    input_ids = input_ids.to(torch.int64)
    B, T = input_ids.shape
    lengths = torch.full((B,), T, dtype=torch.int64) if lengths is None else lengths.to(torch.int64).cpu()
    dev = next(model.parameters()).device
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.int64)
    seen: list[torch.Tensor] = []
    hook = (final_norm(model).register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
            if pre else None)
    try:
        out = model(input_ids=input_ids.to(dev), attention_mask=mask.to(dev), output_hidden_states=True,
                    use_cache=False)
    finally:
        if hook is not None:
            hook.remove()
    if pre and len(seen) != 1:
        raise TargetError(f"{type(model).__name__}: the final norm ran {len(seen)} times in one forward; the "
                          "last layer's pre-norm output is ambiguous")
    hs = out.hidden_states
    aux = [seen[0] if i in pre else hs[i].detach() for i in idx]
    top = None
    if top_logits > 0:
        got = torch.topk(out.logits.float(), min(top_logits, out.logits.shape[-1]), dim=-1)
        top = (got.values.cpu(), got.indices.to(torch.int64).cpu())
    return TargetCapture(input_ids=input_ids, lengths=lengths, hf_indices=idx, prenorm=pre, aux=aux,
                         aux_cat=torch.cat(aux, dim=-1), argmax=out.logits.argmax(-1).cpu(),
                         hidden_states=tuple(h.detach() for h in hs) if keep_all else None, logits_top=top)


@torch.no_grad()
def greedy_generate(model, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Greedy continuation of equal-length ``prompts`` [B, P] int64 (no padding): transformers'
    ``model.generate`` (``do_sample=False``, one beam, KV cache). Returns [B, max_new_tokens].

    EOS is not treated specially: generation never stops early (``eos_token_id=[]``: no stop
    token), and no token is forced or suppressed, so every step is the plain argmax of the last
    logits. The target's own ``generation_config`` (a repetition penalty, a forced EOS, suppressed
    tokens...) is set aside for the call, since generate would merge it in and change the argmax.
    Every prompt token is attended (an explicit all-ones mask: generate would otherwise mask
    prompt tokens equal to the pad id).
    """
    from transformers import GenerationConfig

    # generate needs a pad id once an EOS list is given; it is never emitted (no sequence finishes)
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, min_new_tokens=0,
                              eos_token_id=[], pad_token_id=0)
    own = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=config)
    finally:
        model.generation_config = own
    return out[:, prompts.shape[1]:]
