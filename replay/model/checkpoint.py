"""Load and save EAGLE-3 draft checkpoints (SpecForge/SGLang and speculators formats).

Formats, each with the source it was read from; config.json of
both is read and written by ``replay.model.draft_config.Eagle3DraftConfig``, the weights here:

- ``specforge`` (what SGLang 0.5.23 serves): ``architectures ["LlamaForCausalLMEagle3"]``, a flat
  LlamaConfig plus ``draft_vocab_size``, optional ``target_hidden_size``,
  ``num_aux_hidden_states``, ``norm_before_fc`` (``eagle_config`` first, then top level),
  ``fc_norm`` / ``use_aux_norm``, ``norm_output``; aux ids ONLY in
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang convention; a top-level key is
  ignored by SGLang, llama_eagle3.py:156-161, llama.py set_eagle3_layers_to_capture).
  Weights ``fc.weight [Hd, K*H]``, ``midlayer.*`` (SGLang also accepts ``layers.0.*`` and a
  ``model.`` prefix, legacy ``aux_norm_low/mid/high`` = ``fc_norm.0/1/2``; llama_eagle3.py:
  337-348), ``norm.weight``, ``lm_head.weight [Vd, Hd]``, ``d2t`` int64 [Vd], ``t2d`` bool [V];
  no embedding (SGLang shares the target's).
- ``speculators`` (speculators 0.9.0 ``eagle3/config.py`` + ``core.py``): ``architectures
  ["Eagle3DraftModel"]`` (or ``Eagle3Speculator``), ``speculators_model_type "eagle3"``, dims in
  ``transformer_layer_config``; top-level ``draft_vocab_size``, ``norm_before_fc``,
  ``norm_before_residual``, ``fc_norm``, ``norm_output``, ``target_hidden_size``,
  ``eagle_aux_hidden_state_layer_ids`` (vLLM convention = HF index) and
  ``speculators_config.verifier.name_or_path``. Weights ``layers.0.*``, ``embed_tokens.weight``,
  ``input_norm.weight``; ``verifier_norm.weight`` / ``verifier_lm_head.weight`` are ignored.

Only safetensors, or ``torch.load(weights_only=True)`` for ``.bin``: no pickle code runs. Which files
hold the weights, their headers, the names as SGLang loads them and the shapes a config implies are
``replay.model.weight_files`` (torch-free, what ``specdiff check`` reads).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdiff.eagle3.aux_layers import ConventionError, native_aux_ids, resolve_aux_ids
from specdiff.eagle3.vocab_map import read_d2t
from specdiff.replay.model.draft_config import (  # noqa: F401  (re-exported: callers)
    FORMATS,
    SPECFORGE_ARCH,
    SPECULATORS_ARCHS,
    CheckpointError,
    DraftConfigError,
    Eagle3DraftConfig,
    detect_format,
    rope_params,
)
from specdiff.replay.model.draft_model import Eagle3Draft
from specdiff.replay.model.weight_files import (
    OPTIONAL_SHAPES,
    canonical_name,
    expected_shapes,
    ignored_key,
    later_input_norm_aliases,
    later_input_norm_note,
    load_bin,
    unreadable,
    weight_files,
)
from specdiff.tracer.contract import sha256_array
from specdiff.tracer.weight_facts import tensor_fingerprint

__all__ = ["CheckpointError", "LoadedDraft", "load_draft", "save_draft", "read_state_dict", "detect_format",
           "draft_weights_sha256", "rope_params"]


# ---- files ------------------------------------------------------------------------------
def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: every ``*.safetensors`` file, else ``*.bin``
    loaded with ``weights_only=True``. Raises CheckpointError when there is none or one is
    unreadable (the file named)."""
    path = Path(path)
    kind, files = weight_files(path)
    out: dict[str, torch.Tensor] = {}
    for f in files:
        if kind == "bin":
            out.update(load_bin(f))
            continue
        from safetensors.torch import load_file
        try:
            out.update(load_file(str(f)))
        except Exception as e:  # corrupt header etc.
            raise unreadable(f, e) from None
    return out


# ---- weights ----------------------------------------------------------------------------
def _width_message(name: str, got, want, cfg: Eagle3DraftConfig) -> str:
    g, w = list(got), list(want)
    if name == "fc.weight" and len(g) == 2 and g[1] != w[1]:
        return (f"fc.weight is {g} but {cfg.num_aux} aux slots x target hidden "
                f"{cfg.target_hidden_size} = {cfg.aux_width}")
    return f"{name} is {g} but the config implies {w}"


def draft_weights_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over a draft state dict in canonical (SpecForge) names, sorted, excluding
    ``embed_tokens.weight`` (its source is a separate fact) and ``verifier_*``: for each tensor
    the name, dtype, shape and raw bytes. The same weights hash the same in both formats."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        if name == "embed_tokens.weight" or name.startswith("verifier_"):
            continue
        t = state_dict[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class LoadedDraft:
    """A loaded draft and what is known about it.

    Attributes:
        model: the Eagle3Draft (eval mode, requested dtype; d2t/t2d keep int64/bool).
        config: its Eagle3DraftConfig.
        format: 'specforge' or 'speculators'.
        path: the checkpoint directory.
        raw_config: config.json as read.
        has_d2t / has_t2d: whether the file had them (absent d2t = identity mapping).
        verifier: speculators_config.verifier.name_or_path, if any.
        weights_sha256: ``draft_weights_sha256`` of the file's tensors.
        notes: plain-words remarks (ignored keys, suspicious d2t, ...).
        weight_fingerprints: file tensor name -> ``tracer.weight_facts.tensor_fingerprint`` (the
            contract's ``draft_weights``, computed on the load path as an engine's recorder does).
    """

    model: Eagle3Draft
    config: Eagle3DraftConfig
    format: str
    path: str
    raw_config: dict
    has_d2t: bool
    has_t2d: bool
    verifier: str | None
    weights_sha256: str
    notes: list[str] = field(default_factory=list)
    weight_fingerprints: dict[str, str] = field(default_factory=dict)

    def serve_window(self, window: int) -> None:
        """Compute the attention SGLang 0.5.23 serves with ``--speculative-draft-window-size window``:
        every layer's window ``window`` counted over the KV sequence (eagle3/attention_window.py ``KV``,
        llama_eagle3.py:286-299), in ``config`` and the model's config alike.

        Raises:
            CheckpointError: the draft config names windows of its own (``layer_types`` /
                ``sliding_window``): one or the other, never the user's config rewritten.
        """
        from dataclasses import replace

        from specdiff.eagle3.attention_window import KV

        if self.config.attention_windows is not None:
            raise CheckpointError(f"{self.path}: the draft config already gives attention windows "
                                  f"{list(self.config.attention_windows)} (layer_types / sliding_window); drop "
                                  "--draft-window, or record with a config without them")
        self.config = self.model.config = replace(self.config, window_distance=KV,
                                                  attention_windows=(int(window),) * self.config.num_hidden_layers)

    def contract_facts(self, num_layers: int | None = None) -> dict:
        """Contract facts (tracer.contract field names) of this draft; the aux capture is
        resolved to HF indices when the target's layer count ``num_layers`` is given."""
        m, c = self.model, self.config
        facts = {
            "draft_name": self.path,
            "draft_format": self.format,
            "hidden_size": c.target_hidden_size,
            "draft_hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size,
            "draft_vocab_size": c.draft_vocab_size,
            "draft_num_aux": c.num_aux,
            "norm_before_fc": c.norm_before_fc,
            "fc_norm": c.fc_norm,
            "norm_output": c.norm_output,
            "norm_before_residual": c.norm_before_residual,
            "d2t_sha256": sha256_array(m.d2t) if self.has_d2t else None,
            "t2d_sha256": sha256_array(m.t2d) if self.has_t2d else None,
            "hot_token_id_sha256": sha256_array(m.hot_token_id()) if self.has_d2t else None,
            "draft_weights_sha256": self.weights_sha256,
            "embed_source": m.embed_source,
            "lm_head_source": m.lm_head_source,
            "aux_native_ids": c.eagle_aux_hidden_state_layer_ids,
            "aux_convention": c.aux_convention,
            "draft_notes": list(self.notes),
        }
        if num_layers is not None:
            try:
                res = resolve_aux_ids(c.eagle_aux_hidden_state_layer_ids,
                                      convention=c.aux_convention, num_layers=num_layers)
            except ConventionError as e:
                raise CheckpointError(f"{self.path}: aux ids: {e}") from None
            facts.update(res.as_facts())
            facts["num_layers"] = num_layers
            facts["draft_notes"] = facts["draft_notes"] + list(res.notes)
        return facts


def load_draft(path: str | Path, *, dtype: torch.dtype = torch.float32,
               target_embedding: torch.Tensor | None = None,
               target_lm_head: torch.Tensor | None = None) -> LoadedDraft:
    """Load a draft directory in either format.

    Args:
        path: directory with config.json and weights.
        dtype: parameter dtype of the returned model.
        target_embedding: the target's input embedding [V, H], used when the checkpoint has no
            ``embed_tokens.weight`` (SGLang shares the target's); else the embedding stays random.
        target_lm_head: the target's lm_head [V, H], used only when the checkpoint has no
            lm_head and its config has no ``draft_vocab_size`` (SGLang ``load_lm_head_from_target``).

    Raises:
        CheckpointError: unreadable files, not an EAGLE-3 draft, missing/unexpected keys or
            mismatched widths (all named in one line).
    """
    path = Path(path)
    cfg = Eagle3DraftConfig.from_file(path)
    raw = json.loads((path / "config.json").read_text())
    fmt, notes = cfg.format, list(cfg.notes)
    sd_file = read_state_dict(path)

    canon: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    unexpected: list[str] = []
    expected = expected_shapes(cfg)
    aliases = later_input_norm_aliases(sd_file)
    for name, t in sd_file.items():
        if name in aliases:
            canon[aliases[name]], origin[aliases[name]] = t, name
            notes.append(later_input_norm_note(name, aliases[name]))
            continue
        if ignored_key(name):
            notes.append(f"ignored {name}")
            continue
        c = canonical_name(name)
        if c not in expected and c not in OPTIONAL_SHAPES:
            unexpected.append(name)
            continue
        canon[c], origin[c] = t, name
    lm_from_target = ("lm_head.weight" not in canon and target_lm_head is not None
                      and cfg.lm_head_from_target)
    missing = [k for k in expected if k not in canon and not (k == "lm_head.weight" and lm_from_target)]
    problems = []
    if missing:
        problems.append("missing keys: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected keys: " + ", ".join(sorted(unexpected)))
    for c, t in canon.items():
        want = expected[c] if c in expected else OPTIONAL_SHAPES[c](cfg)
        if tuple(t.shape) != tuple(want):
            problems.append(_width_message(origin[c], t.shape, want, cfg))
    if "d2t" in canon and canon["d2t"].is_floating_point():
        problems.append(f"d2t has dtype {canon['d2t'].dtype}, expected int64 offsets")
    if problems:
        raise CheckpointError(f"draft checkpoint {path} ({fmt} format): " + "; ".join(problems))

    try:
        model = Eagle3Draft(cfg)
    except ValueError as e:  # e.g. an unsupported rope_scaling type
        raise CheckpointError(f"draft checkpoint {path}: {e}") from None
    state = {k: v for k, v in canon.items() if k not in ("d2t", "t2d")}
    model.load_state_dict(state, strict=False)
    has_d2t, has_t2d = "d2t" in canon, "t2d" in canon
    if has_d2t:
        model.d2t.copy_(canon["d2t"].to(torch.int64))
        _check_d2t(model.d2t, cfg.vocab_size, notes)
    else:
        notes.append("no d2t: draft ids are served as target ids (identity mapping)")
    if has_t2d:
        model.t2d.copy_(canon["t2d"].to(torch.bool))
    if "embed_tokens.weight" in canon:
        model.embed_source = "draft"
    elif target_embedding is not None:
        try:
            model.set_target_embedding(target_embedding)
        except ValueError as e:
            raise CheckpointError(f"draft checkpoint {path}: {e}") from None
    else:
        notes.append("no embed_tokens in the checkpoint and no target embedding given: embedding is random")
    if "lm_head.weight" in canon:
        model.lm_head_source = "draft"
    elif lm_from_target:
        try:
            model.set_target_lm_head(target_lm_head)
        except ValueError as e:
            raise CheckpointError(f"draft checkpoint {path}: {e}") from None
    model.to(dtype)
    model.d2t.data = model.d2t.data.to(torch.int64)
    model.t2d.data = model.t2d.data.to(torch.bool)
    model.eval()
    verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return LoadedDraft(model=model, config=cfg, format=fmt, path=str(path), raw_config=raw,
                       has_d2t=has_d2t, has_t2d=has_t2d, verifier=verifier,
                       weights_sha256=draft_weights_sha256(canon), notes=notes,
                       weight_fingerprints={n: tensor_fingerprint(t) for n, t in sd_file.items()})


def _check_d2t(d2t: torch.Tensor, vocab_size: int, notes: list[str]) -> None:
    r = read_d2t(d2t, vocab_size=vocab_size)
    if r.is_arange:
        notes.append("d2t equals arange(Vd): read as offsets it maps draft id i to 2i "
                     "(it may hold direct ids or a placeholder)")
    if not r.in_range:
        notes.append(f"d2t read as offsets maps draft ids outside the target vocab [0, {vocab_size}): "
                     "it may hold direct target ids")


# ---- writing ----------------------------------------------------------------------------
def _ids_for(cfg: Eagle3DraftConfig, convention: str, target_num_layers: int | None):
    ids = cfg.eagle_aux_hidden_state_layer_ids
    if ids is None or cfg.aux_convention == convention:
        return ids
    if target_num_layers is None:
        raise CheckpointError(f"aux ids {ids} are in the {cfg.aux_convention} convention; pass "
                              f"target_num_layers to write them in the {convention} convention")
    # One id for one id, in the order listed: a converted checkpoint keeps its slot order.
    try:
        res = resolve_aux_ids(ids, convention=cfg.aux_convention, num_layers=target_num_layers, concat="listed")
        return native_aux_ids(res.hf_indices, convention, num_layers=target_num_layers)
    except ConventionError as e:
        raise CheckpointError(f"aux ids {ids} ({cfg.aux_convention}) cannot be written in the {convention} "
                              f"convention as given: {e}") from None


def save_draft(model: Eagle3Draft, directory: str | Path, format: str = "specforge", *,
               verifier: str | None = None, include_embed: bool | None = None,
               target_num_layers: int | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` as config.json + model.safetensors in ``format``.

    Args:
        format: 'specforge' (SGLang-servable: ``midlayer.*``, ``layers.{i}.*`` for i >= 1 with the layer's
            input norm as ``hidden_norm`` and ``input_layernorm`` both, see below, ids in ``eagle_config`` in the SGLang
            convention, no embedding unless ``include_embed``) or 'speculators' (``layers.0.*``,
            ``embed_tokens``, top-level ids in the vLLM convention, ``speculators_config``).
        verifier: target path/name for ``speculators_config.verifier.name_or_path``.
        include_embed: write ``embed_tokens.weight`` (default: False for specforge, True for
            speculators).
        target_num_layers: needed only to convert aux ids between conventions.
        dtype: cast float tensors before writing (default: as in the model).
    """
    if format not in FORMATS:
        raise CheckpointError(f"unknown draft format {format!r}; use one of {', '.join(FORMATS)}")
    from safetensors.torch import save_file
    cfg = model.config
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    include_embed = (format == "speculators") if include_embed is None else include_embed
    sd = {}
    for name, t in model.state_dict().items():
        if name == "embed_tokens.weight" and not include_embed:
            continue
        t = t.detach().cpu().contiguous()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        if format == "speculators" and name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        sd[name] = t.clone()
    # A later layer's input norm under both names: SGLang 0.5.23 reads hidden_norm (llama_eagle3.py:103-105) and
    # builds an input_layernorm it never calls; vLLM 0.32.0 (llama_eagle3.py:136-138) and speculators 0.9.0's
    # plain decoder layer (models/eagle3/core.py:81-94) read input_layernorm. One file then serves both engines
    # and leaves no parameter as allocated (draft_unloaded stays empty); load_draft reads hidden_norm
    for i in range(1, cfg.num_hidden_layers):
        sd[f"layers.{i}.input_layernorm.weight"] = sd[f"layers.{i}.hidden_norm.weight"].clone()
    ids = _ids_for(cfg, "sglang" if format == "specforge" else "speculators", target_num_layers)
    wdtype = str(dtype or model.fc.weight.dtype).replace("torch.", "")
    cfg.write(directory, format, aux_ids=ids, torch_dtype=wdtype, verifier=verifier)
    save_file(sd, str(directory / "model.safetensors"))
    return directory
