"""speculators 0.9.0 as the training side: ``Eagle3DraftModel`` loaded by speculators' own code, its
``forward`` (the TTT loop) run on a packed batch as speculators trains.

Sources (speculators 0.9.0 wheel):

- **loading**: an SGLang/SpecForge-format checkpoint goes through speculators' own converter
  (``speculators/convert/eagle/eagle3_converter.py:35-108``: ``midlayer.*`` -> ``layers.0.*`` at
  ``:203-210``, the norm flags passed as the reference parsed them, ``:139-145``) into a temporary
  directory, then ``Eagle3DraftModel.from_pretrained`` (``models/eagle3/core.py:164-172``), which
  takes ``embed_tokens`` from the verifier (the target) where the checkpoint has none and keeps the
  checkpoint's ``lm_head`` (``speculators/model.py:123-190``). A speculators-format draft loads
  directly. Measured under transformers 5.19: ``from_pretrained`` leaves ``embed_tokens`` as
  uninitialised memory (it is marked ``_is_hf_initialized`` at construction, ``model.py:75-80``) and
  the verifier's embedding is loaded only when that memory happens to hold a NaN (``model.py:169-170``),
  so the draft intermittently embeds with garbage; a draft without its own embedding therefore gets
  the verifier's through speculators' own ``_load_verifier_weights(overwrite_embed_tokens=True)``
  (``model.py:127-133``). The aux ids in the config only size ``fc`` (``core.py:71-78``): the target side is
  specdiff's, so this run's training aux layers (HF indices) are given.
- **the batch** (``models/eagle3/data.py:8-44`` ``shift_batch``; ``train/data.py:398-445``
  collate): sequences packed back to back as [1, N]; row t pairs h_t with x_{t+1}; rope
  ``position_ids`` start at **1** (``data.py:35``); ``document_ids`` keep sequences apart
  (``attention.py:10-34``). shift_batch drops each sequence's last row (no x_{t+1}); it is kept here
  with token 0 so the rows line up with the reference's: that row's key is seen by no other query
  (causal within its document), so no defined row changes.
- **the TTT loop** (``core.py:193-365``): fc (after ``input_norm`` / ``fc_norm``), per step
  ``cat(embed, hidden)`` -> ``rotary_emb(hidden, position_ids)`` -> the decoder layers with the
  mask extended by one diagonal block per step (``attention.py:37-112``) -> ``lm_head(norm(h))``
  (the normed hidden fed back with ``norm_output``, ``:302-307``) -> ids shifted left by 1 + step, 0-padded;
  ``position_ids + 1`` per step (``:332-357``). The rope positions are read by a pre-hook on ``rotary_emb``.
- The loss (``verifier_last_hidden_states`` not given) is not computed; no draft stage depends on it.
- **precision** (``train/trainer.py:539-545``, ``train/config/schema.py:218-222``): master weights
  fp32, the forward under ``torch.autocast(dtype=hidden_states_dtype)``, bf16 by default. So here:
  the checkpoint's weights upcast to fp32, and ``--dtype`` bfloat16 / float16 runs under autocast in
  that dtype (``trainer_variants.compute``); float32 runs without autocast.

**Variant**: rope positions t + k + 1 where the reference (and SGLang's draft-extend) uses t + k:
recorded as ``trainer_variants.rope_position_offset = 1``. Rope is relative, so attention scores
agree; ``draft.positions`` differs by one.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from specdiff.replay.model.draft_model import TTTOutput
from specdiff.replay.model.weight_files import read_weight_headers
from specdiff.replay.trainers.base import TrainerDraft, unloaded_parameters
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.replay.trainers.stages import StageHooks
from specdiff.tracer.weight_facts import layer_input_norms

__all__ = ["load", "SpeculatorsDraft", "ROPE_POSITION_OFFSET", "config_facts"]

#: speculators' rope position of row t at step 0 is t + 1 (models/eagle3/data.py:35)
ROPE_POSITION_OFFSET = 1

_PATHS = {"fc": "fc", "embed": "embed_tokens", "hidden_norm": "layers.0.hidden_norm",
          "attn": "layers.0.self_attn.q_proj", "norm": "norm", "lm_head": "lm_head"}


#: packed length multiple: speculators' mask extension assumes whole flex-attention blocks
#: (models/eagle3/attention.py:38-50; torch's default block size 128); its collate pads the packed
#: batch to ``max_len`` with zeros and document id -1 (train/data.py:398-445)
PACK_MULTIPLE = 128


def pack(aux_cat: torch.Tensor, input_ids: torch.Tensor, lengths: torch.Tensor):
    """A right-padded batch as speculators' packed one (module doc): hidden [1, N, K*H], input ids
    [1, N] (x_{t+1}, 0 past each sequence's end), position ids [1, N] (t + 1), document ids [1, N]
    (-1 on the zero padding up to a multiple of ``PACK_MULTIPLE``)."""
    hs, ids, pos, doc = [], [], [], []
    for b, n in enumerate(lengths.tolist()):
        hs.append(aux_cat[b, :n])
        ids.append(torch.cat([input_ids[b, 1:n], input_ids.new_zeros(1)]))
        pos.append(torch.arange(1, n + 1, dtype=torch.long))
        doc.append(torch.full((n,), b, dtype=torch.long))
    n = int(lengths.sum())
    pad = -n % PACK_MULTIPLE
    hs.append(aux_cat.new_zeros((pad, aux_cat.shape[-1])))
    ids.append(input_ids.new_zeros(pad))
    pos.append(torch.zeros(pad, dtype=torch.long))
    doc.append(torch.full((pad,), -1, dtype=torch.long))
    return (torch.cat(hs)[None], torch.cat(ids)[None], torch.cat(pos)[None], torch.cat(doc)[None])


def unpacker(lengths: torch.Tensor, T: int):
    """fn([1, N, ...] packed) -> [B, T, ...] right-padded with zeros."""
    ends = torch.cumsum(lengths, 0).tolist()
    starts = [e - n for e, n in zip(ends, lengths.tolist(), strict=True)]

    def unpack(t: torch.Tensor) -> torch.Tensor:
        out = t.new_zeros((len(ends), T, *t.shape[2:]))
        for b, (s, e) in enumerate(zip(starts, ends, strict=True)):
            out[b, : e - s] = t[0, s:e]
        return out
    return unpack


class SpeculatorsDraft(TrainerDraft):
    """speculators' ``Eagle3DraftModel`` driven through its own ``forward`` (fp32 weights; autocast to
    ``compute_dtype`` unless it is float32)."""

    compute_dtype: torch.dtype = torch.float32

    def ttt_forward(self, aux_cat, input_ids, steps=1, *, lengths=None, pad_id=0) -> TTTOutput:
        model = self.model
        B, T = input_ids.shape
        dev = next(model.parameters()).device
        lengths = torch.full((B,), T, dtype=torch.int64) if lengths is None else lengths.to(torch.int64).cpu()
        hs, ids, pos, doc = pack(aux_cat.cpu(), input_ids.cpu(), lengths)
        hooks = StageHooks(model, _PATHS, positions=("rotary_emb", lambda a, kw: a[1]),
                           layers=tuple(f"layers.{i}" for i in range(len(model.layers) - 1)))
        autocast = torch.autocast(dev.type, dtype=self.compute_dtype, enabled=self.compute_dtype != torch.float32)
        with torch.no_grad(), autocast, hooks, warnings.catch_warnings():
            # off CUDA speculators' forward is not compiled (models/utils.py:71-76), so torch warns that
            # flex_attention runs unfused: the same scores, materialised; nothing for the user to do
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            model(hidden_states=hs.to(dev, self.compute_dtype), input_ids=ids.to(dev), document_ids=doc.to(dev),
                  position_ids=pos.to(dev), ttt_steps=steps)
        return hooks.output(lengths, self.d2t, unpack=unpacker(lengths, T))


def config_facts(model) -> dict:
    """What speculators' own config of the loaded draft says (``Eagle3SpeculatorConfig``,
    models/eagle3/config.py; its ``speculators_config``, speculators/config.py): algorithm, proposal,
    verifier, aux ids, norm flags, decoder layers and their attention types; the contract's
    ``trainer_config`` (a converted SGLang draft: the config speculators' converter wrote)."""
    c = model.config
    sc = getattr(c, "speculators_config", None)
    tl = getattr(c, "transformer_layer_config", None)
    proposals = getattr(sc, "proposal_methods", None) or []
    verifier = getattr(sc, "verifier", None)
    facts = {
        "speculators_version": getattr(c, "speculators_version", None),
        "speculators_model_type": getattr(c, "speculators_model_type", None),
        "algorithm": getattr(sc, "algorithm", None),
        "speculative_tokens": getattr(proposals[0], "speculative_tokens", None) if proposals else None,
        "verifier": getattr(verifier, "name_or_path", None),
        "verifier_architectures": list(getattr(verifier, "architectures", None) or []),
        "eagle_aux_hidden_state_layer_ids": list(c.eagle_aux_hidden_state_layer_ids or []),
        "num_hidden_layers": getattr(tl, "num_hidden_layers", None),
        "layer_types": list(getattr(tl, "layer_types", None) or []),
        "sliding_window": getattr(tl, "sliding_window", None),
    }
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        facts[flag] = bool(getattr(c, flag, False))
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in facts.items()}


def _windows(model, cfg) -> None:
    """Give the loaded model the draft config's attention windows as speculators builds them from a
    speculators config (``models/eagle3/core.py:96-105``: ``sliding_window`` and the indices of the
    ``sliding_attention`` layers), which its converter of an SGLang-format draft does not carry over.

    Raises:
        RecordTrainError: windows speculators cannot compute: counted by SGLang's rule (``--draft-window``),
            or of several sizes (one ``sliding_window`` per model).
    """
    from specdiff.eagle3.attention_window import PREFIX

    want = cfg.attention_windows
    if want is None:
        return
    sizes = {w for w in want if w is not None}
    if cfg.window_distance != PREFIX or len(sizes) != 1:
        raise RecordTrainError(f"speculators cannot compute the attention windows {list(want)} counted by the "
                               f"{cfg.window_distance!r} rule: it slides one window over the prefix at every TTT "
                               "depth (models/eagle3/attention.py:16-19); record with --trainer specdiff")
    model.sliding_window = sizes.pop() + 1
    model.sliding_window_indices = [i for i, w in enumerate(want) if w is not None]
    model.uses_sliding_window_attn = True
    model.uses_full_attn = len(model.sliding_window_indices) < len(want)


#: parameters speculators' ``_load_verifier_weights`` fills from the verifier (model.py:127-190), so a
#: checkpoint without them leaves nothing as initialised
_FROM_VERIFIER = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight")


def _later_layers(model, reference) -> tuple[set[str], list[str]]:
    """Load an SGLang-format draft's decoder layers 1..N-1 into speculators' model.

    speculators 0.9.0's converter saves through a one-layer model (``Eagle3Speculator``,
    convert/eagle/eagle3_legacy_model.py:307-315) whose ``load_state_dict(strict=False)`` drops every
    ``layers.{i}.*`` key (eagle3_converter.py:202-218, logged only), and ``Eagle3DraftModel`` then builds
    N layers (models/eagle3/core.py:81-94) and initialises the missing ones at random: the trainer would
    compute a different draft. They are copied here from ``reference`` (the loaded reference draft,
    ``replay.model.draft_model``, which holds the file's tensors), by name but one: SGLang 0.5.23
    normalises a later layer's input with ``hidden_norm`` (llama_eagle3.py:97-105) where speculators'
    plain decoder layer uses ``input_layernorm`` (the file's ``input_layernorm``, which SGLang never
    reads, is not used).

    Returns:
        (the speculators parameter names filled, one note per layer for the trace's notes).

    Raises:
        RecordTrainError: a later layer whose tensor shapes speculators' layer cannot hold.
    """
    filled, notes = set(), []
    for i, layer in enumerate(model.layers):
        if i == 0:
            continue
        for name, src in reference.layers[str(i)].named_parameters():
            into = "input_layernorm.weight" if name == "hidden_norm.weight" else name
            dst = layer.get_parameter(into)
            if dst.shape != src.shape:
                raise RecordTrainError(f"speculators' layers.{i}.{into} is {tuple(dst.shape)}, the checkpoint's "
                                       f"layers.{i}.{name} is {tuple(src.shape)}: record with --trainer specdiff")
            with torch.no_grad():
                dst.copy_(src.to(dst.dtype))
            filled.add(f"layers.{i}.{into}")
        notes.append(f"layers.{i}.* loaded into speculators' model by specdiff: its converter keeps one decoder layer "
                     "(convert/eagle/eagle3_legacy_model.py:307-315); layers."
                     f"{i}.hidden_norm.weight (SGLang's input norm of a later layer, llama_eagle3.py:97-105) as "
                     f"speculators' layers.{i}.input_layernorm (models/eagle3/core.py:81-94)")
    return filled, notes


def load(*, target_dir: Path, loaded, dtype: torch.dtype, device: str, version: str,
         aux_hf_indices=None, **_) -> SpeculatorsDraft:
    """The draft at ``loaded.path`` loaded by speculators (module doc), on ``device``.

    Raises:
        RecordTrainError: speculators' converter or loader refuses it (one line).
    """
    from loguru import logger
    from speculators.models.eagle3.core import Eagle3DraftModel

    logger.disable("speculators")  # its converter logs every step at INFO on stderr
    cfg = loaded.config
    try:
        if loaded.format == "speculators":
            model = Eagle3DraftModel.from_pretrained(str(loaded.path))
            written = set(read_weight_headers(loaded.path, load=())[0])
        else:
            from speculators.convert.eagle.eagle3_converter import Eagle3Converter
            with tempfile.TemporaryDirectory(prefix="specdiff-speculators-") as tmp:
                Eagle3Converter().convert(
                    str(loaded.path), tmp, base_model=str(target_dir), validate=False,
                    norm_before_residual=cfg.norm_before_residual, norm_before_fc=cfg.norm_before_fc,
                    fc_norm=cfg.fc_norm, norm_output=cfg.norm_output,
                    eagle_aux_hidden_state_layer_ids=list(aux_hf_indices) if aux_hf_indices else None)
                model = Eagle3DraftModel.from_pretrained(tmp)
                written = set(read_weight_headers(tmp, load=())[0])
        if loaded.model.embed_source != "draft":
            model._load_verifier_weights(overwrite_embed_tokens=True)  # module doc: never the uninitialised one
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise RecordTrainError(f"speculators cannot load {loaded.path}: {type(e).__name__}: {e}") from None
    _windows(model, cfg)
    variants: dict = {"rope_position_offset": ROPE_POSITION_OFFSET}
    if dtype != torch.float32:
        variants["compute"] = f"fp32 weights under torch.autocast({str(dtype).removeprefix('torch.')})"
    notes = [f"speculators {version}: rope positions start at 1 (models/eagle3/data.py:35): draft.positions "
             "is t + k + 1; rope is relative, so the attention agrees with t + k"]
    filled: set[str] = set()
    if loaded.format != "speculators":
        filled, layer_notes = _later_layers(model, loaded.model)
        notes.extend(layer_notes)
    # by construction: every parameter of the trainer's model that no file, no verifier and no copy above set
    unloaded = unloaded_parameters(model, written, filled | set(_FROM_VERIFIER))
    draft = SpeculatorsDraft(model.to(device=device, dtype=torch.float32).eval(), trainer="speculators",
                             # a later layer is a plain decoder layer: input_layernorm (models/eagle3/core.py:81-94)
                             layer_input_norms=layer_input_norms(model.layers, "input_layernorm"),
                             version=version, variants=variants, notes=notes, config=config_facts(model),
                             unloaded=unloaded)
    draft.compute_dtype = dtype
    return draft
