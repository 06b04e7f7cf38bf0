"""SpecForge 0.2.0 as the training side: ``LlamaForCausalLMEagle3`` built and loaded by SpecForge's
own ``AutoDraftModel``, its TTT steps run as ``OnlineEagle3Model.forward`` runs them.

Sources (specforge 0.2.0 wheel):

- **loading**, as SpecForge's training builds a warm-started draft
  (``specforge/algorithms/model_providers.py:91-112`` ``build_eagle3_draft``): the config through
  ``AutoDraftModelConfig.from_file`` (``modeling/auto.py:74-116``), the class from
  ``architectures`` (``modeling/draft/registry.py``) by ``AutoDraftModel.from_config``, the weights by
  ``training/model_loading.py:401-466`` ``warm_start_draft_model`` (the SGLang-format keys are
  SpecForge's: ``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``; a missing embedding
  is allowed), then the target's embedding by ``Eagle3DraftModel.load_embedding``
  (``modeling/draft/base.py:134-186``, key ``model.embed_tokens.weight``) when the draft has none.
  ``AutoDraftModel.from_pretrained`` alone is not used: under transformers 5.19 it leaves the
  non-persistent rope buffers (``inv_freq``, ``cos_cached``: ``llama3_eagle.py:278-301``)
  uninitialised (NaN / garbage), measured; ``warm_start`` copies only the state dict into a model
  built by ``from_config``, where they are computed.
- **what the class can hold** (``modeling/draft/llama3_eagle.py:1654-1700``: midlayer ``:1668``, fc ``:1674-1678``): ``fc`` is
  ``3 * target_hidden_size`` wide and ``fc_norm`` has 3 slots; no ``input_norm``
  (``norm_before_fc``); the decoder's residual is the pre-norm hidden (``:1625``, no
  ``norm_before_residual``). Other drafts are refused in one line.
- **the TTT loop** (``specforge/algorithms/eagle3/model.py:313-432``): ``project_hidden_states``
  (fc_norm then fc), ``_prepare_position_ids`` (arange(T)), ``prepare_decoder_attention_mask``
  (``base.py:62-95``, causal + key padding, additive), ``cache_hidden = [[], []]`` for the sdpa
  backend (``:353-356``); per step (``:364-432``) ``embed_input_ids`` -> ``backbone`` -> the pre-norm
  output is fed back (``:397``) -> ``compute_logits`` (``norm`` then ``lm_head`` while ``norm_output``, default True,
  ``llama3_eagle.py:1690,1772-1777``) -> ``padding(input_ids, left=False)`` (``utils.py:129-135``).
  Step 0's ids are the batch shifted once (``modeling/target/target_head.py:103-107``
  ``preprocess``): row t consumes x_{t+1}, 0 past the end.
- **rope in the TTT steps** (``llama3_eagle.py:717-734``): step k rotates q/k at
  ``position_ids + len(cache_hidden[0])`` = t + k, read by a pre-hook on ``midlayer.self_attn``.
- The loss and metric terms of the loop are left out: they need the target's full distribution and
  a triton kernel (``specforge/core/loss.py:173-201``), and no draft stage depends on them.
- SpecForge decorates its RMSNorm / rope with ``torch.compile`` (``llama3_eagle.py:133,
  303, 1561``); they run eagerly here (``torch.compiler.set_stance("force_eager")``): the same code,
  without inductor's fused kernels, on any device.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

from specdiff.replay.model.draft_model import TTTOutput
from specdiff.replay.model.weight_files import read_weight_headers
from specdiff.replay.trainers.base import TrainerDraft, unloaded_parameters
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.replay.trainers.stages import StageHooks

__all__ = ["load", "SpecForgeDraft"]

_PATHS = {"fc": "fc", "embed": "embed_tokens", "hidden_norm": "midlayer.hidden_norm",
          "attn": "midlayer.self_attn.q_proj", "norm": "norm", "lm_head": "lm_head"}


def _rope_positions(_args, kwargs) -> torch.Tensor:
    """llama3_eagle.py:717-734: the step's rope position is position_ids + len(cache_hidden[0]),
    read before the attention appends this step's keys."""
    cache = kwargs.get("cache_hidden")
    return kwargs["position_ids"] + (len(cache[0]) if cache is not None else 0)


def _refuse_unsupported(cfg) -> None:
    why = []
    if cfg.num_aux != 3:
        why.append(f"{cfg.num_aux} aux slots (SpecForge's fc is 3 * target_hidden_size wide, llama3_eagle.py:1674-1678)")
    if cfg.norm_before_fc:
        why.append("norm_before_fc (SpecForge's draft has no input_norm)")
    if cfg.norm_before_residual:
        why.append("norm_before_residual (SpecForge's residual is the pre-norm hidden, llama3_eagle.py:1625)")
    if cfg.tie_word_embeddings:
        why.append("tie_word_embeddings (SpecForge unties the draft's lm_head, modeling/auto.py:90-92)")
    layers = getattr(cfg, "num_hidden_layers", 1)
    if layers != 1:
        why.append(f"{layers} decoder layers (SpecForge's draft has one midlayer, llama3_eagle.py:1668)")
    if cfg.partial_rotary_factor != 1.0 or not cfg.rope_is_neox_style:
        why.append("partial or gptj-style rope (SpecForge rotates whole heads neox-style, llama3_eagle.py:126-142)")
    if cfg.attention_windows is not None:
        why.append(f"attention windows {list(cfg.attention_windows)} (SpecForge's draft attends to the whole prefix: "
                   "no attention class in llama3_eagle.py reads a window; its flash paths pass window_size=(-1, -1), :1191, :1245)")
    if why:
        raise RecordTrainError(f"--trainer specforge cannot hold this draft: {'; '.join(why)}")


class SpecForgeDraft(TrainerDraft):
    """SpecForge's ``LlamaForCausalLMEagle3`` driven through its ``OnlineEagle3Model`` TTT loop."""

    def ttt_forward(self, aux_cat, input_ids, steps=1, *, lengths=None, pad_id=0) -> TTTOutput:
        from specforge.algorithms.eagle3.model import OnlineEagle3Model
        from specforge.utils import padding

        draft = self.model
        B, T = input_ids.shape
        dev = next(draft.parameters()).device
        lengths = torch.full((B,), T, dtype=torch.int64) if lengths is None else lengths.to(torch.int64).cpu()
        online = OnlineEagle3Model(draft, length=steps, attention_backend="sdpa")
        hooks = StageHooks(draft, _PATHS, positions=("midlayer.self_attn", _rope_positions))
        with torch.no_grad(), torch.compiler.set_stance("force_eager"), hooks:
            ids = padding(input_ids.to(dev), left=False)  # modeling/target/target_head.py:103-107 preprocess
            attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).to(dev)
            hidden = draft.project_hidden_states(aux_cat.to(dev, draft.fc.weight.dtype))
            position_ids = online._prepare_position_ids(None, seq_length=T, past_key_values_length=0, device=dev)
            mask = draft.prepare_decoder_attention_mask(attention_mask=attention_mask, hidden_states=hidden,
                                                        batch_size=B, seq_length=T, past_key_values_length=0)
            cache_hidden: list = [[], []]
            for idx in range(steps):
                embeds = draft.embed_input_ids(ids).to(hidden.dtype)
                hidden = draft.backbone(input_embeds=embeds, hidden_states=hidden, cache_hidden=cache_hidden,
                                        attention_mask=mask, position_ids=position_ids, past_key_values=None,
                                        use_cache=True)
                draft.compute_logits(hidden)
                if idx != steps - 1:
                    ids = padding(ids, left=False)
        return hooks.output(lengths, self.d2t)


def load(*, target_dir: Path, loaded, dtype: torch.dtype, device: str, version: str, **_) -> SpecForgeDraft:
    """The draft at ``loaded.path`` built and loaded by SpecForge (module doc), on ``device``.

    Raises:
        RecordTrainError: a draft SpecForge's class cannot hold, or SpecForge's loader refuses it.
    """
    from specforge.modeling.auto import AutoDraftModel, AutoDraftModelConfig
    from specforge.training.model_loading import warm_start_draft_model

    _refuse_unsupported(loaded.config)
    if loaded.format != "specforge":
        raise RecordTrainError(f"--trainer specforge loads SGLang/SpecForge-format drafts; {loaded.path} is "
                               f"{loaded.format} format")
    try:
        # from_file prints to stdout (modeling/auto.py:90-92); a trace command's stdout is its report
        with contextlib.redirect_stdout(sys.stderr):
            config = AutoDraftModelConfig.from_file(str(Path(loaded.path) / "config.json"))
        model = AutoDraftModel.from_config(config, attention_backend="sdpa", torch_dtype=dtype)
        warm_start_draft_model(model, str(loaded.path), draft_config=config, strategy="eagle3",
                               allow_missing_embedding=True)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise RecordTrainError(f"SpecForge cannot load {loaded.path}: {type(e).__name__}: {e}") from None
    notes, provided = [], []
    if loaded.model.embed_source == "target":
        model.load_embedding(str(target_dir))
        notes.append("specforge: the draft's embedding is the target's (Eagle3DraftModel.load_embedding)")
        provided.append("embed_tokens.weight")
    # SpecForge's module names are the SGLang-format file's (midlayer.*, fc, norm, lm_head, embed_tokens)
    unloaded = unloaded_parameters(model, read_weight_headers(loaded.path, load=())[0], provided)
    variants = {}
    raw = loaded.raw_config
    if "norm_output" in raw:
        # one key, two meanings: SpecForge norms before lm_head when it is true (llama3_eagle.py:1690,1772-1777);
        # the reference (speculators' meaning) feeds the normed hidden back
        variants["norm_output"] = f"SpecForge reads norm_output={raw['norm_output']} as 'norm before lm_head'"
    return SpecForgeDraft(model.to(device=device, dtype=dtype).eval(), trainer="specforge", version=version, variants=variants,
                          notes=notes, unloaded=unloaded)
