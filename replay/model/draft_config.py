"""The EAGLE-3 draft config: one class that reads, validates and writes both checkpoint layouts.

Owns ``Eagle3DraftConfig`` (what the reference forward computes with), its ``config.json``
reader (``from_dict`` / ``from_file``; one reader per format in ``draft_config_read``) and writer
(``to_json`` / ``write``) for the two formats, each with the source it was read from:

- ``specforge`` (SpecForge export, what SGLang 0.5.23 serves): architectures
  ``["LlamaForCausalLMEagle3"]``, a flat LlamaConfig plus ``draft_vocab_size``,
  ``target_hidden_size``, ``num_aux_hidden_states``, the norm flags (``specdiff.eagle3.norms``),
  aux ids only in ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang convention; a
  top-level key is ignored by SGLang, llama_eagle3.py:156-161).
- ``speculators`` (speculators 0.9.0 ``models/eagle3/config.py``): architectures
  ``["Eagle3DraftModel"]`` (or ``Eagle3Speculator``), ``speculators_model_type "eagle3"``, the
  Llama dims in ``transformer_layer_config``, top-level ``draft_vocab_size``,
  ``target_hidden_size``, norm flags and ``eagle_aux_hidden_state_layer_ids`` (vLLM convention),
  ``speculators_config.verifier.name_or_path``.

No silent defaults: a field that changes the computation and is absent from the file takes the
value the serving engine (or transformers' LlamaConfig, which SGLang builds the config with)
gives it, and the config records it in ``defaults_used`` (name -> {value, source}), which
``record train`` stores in the trace contract and prints; it is also logged here. A field
without such a value (the dims) is an error naming the field, the file and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from specdiff.eagle3.attention_window import DISTANCES, PREFIX
from specdiff.eagle3.norms import FORMATS, NORM_FLAGS, write_norm_flags
from specdiff.replay.model.draft_config_read import (  # noqa: F401  (_key_path re-exported: its tests)
    READERS,
    CheckpointError,
    DraftConfigError,
    _key_path,
)
from specdiff.replay.model.rope_config import rope_params

__all__ = ["Eagle3DraftConfig", "CheckpointError", "DraftConfigError", "detect_format", "FORMATS",
           "SPECFORGE_ARCH", "SPECULATORS_ARCHS", "ROPE_TYPES", "rope_params"]

log = logging.getLogger(__name__)

SPECFORGE_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHS = ("Eagle3DraftModel", "Eagle3Speculator")
#: rope_scaling types the reference forward implements (``draft_model.rope_inv_freq``)
ROPE_TYPES = (None, "default", "linear", "llama3")
_PROVENANCE = ("source", "format", "defaults_used", "notes")


def detect_format(raw: dict, *, source: str = "config.json") -> str:
    """'specforge' or 'speculators' from a config.json dict (architectures / speculators keys).

    Raises:
        DraftConfigError: neither layout.
    """
    archs = raw.get("architectures") or []
    if any(a in SPECULATORS_ARCHS for a in archs) or "speculators_config" in raw \
            or "transformer_layer_config" in raw:
        return "speculators"
    if SPECFORGE_ARCH in archs:
        return "specforge"
    raise DraftConfigError(field="architectures", file=source,
                           problem=f"{archs} is not an EAGLE-3 draft",
                           fix=f"set architectures to [{SPECFORGE_ARCH!r}] (SpecForge/SGLang layout) or "
                               f"[{SPECULATORS_ARCHS[0]!r}] (speculators layout)")


@dataclass(kw_only=True)
class Eagle3DraftConfig:
    """Dimensions and flags of an EAGLE-3 draft; validated on construction.

    Every field that changes the computation is required (no defaults): a config read from a
    file gets the engine's value for an absent key and lists it in ``defaults_used``.

    Attributes:
        hidden_size: draft hidden Hd.
        intermediate_size: draft MLP width.
        num_attention_heads / num_key_value_heads / head_dim: attention shape.
        rms_norm_eps, rope_theta, rope_scaling: as in a LlamaConfig (rope_scaling None = plain).
        partial_rotary_factor: the fraction of each head's dims rope rotates (the first
            ``int(partial_rotary_factor * head_dim)``; the rest pass unrotated), SGLang 0.5.23
            srt/models/llama.py:199-200, applied in layers/rotary_embedding/base.py:343-355.
        rope_is_neox_style: rotate halves (True, neox) or interleaved pairs (False, gptj),
            SGLang 0.5.23 srt/models/llama.py:335 (``getattr(config, "rope_is_neox_style", True)``).
        tie_word_embeddings: the config ties lm_head to embed_tokens. SGLang 0.5.23 then makes the
            draft's lm_head its embed_tokens (srt/models/llama_eagle3.py:303-304), which set_embed
            replaces with the target's embedding (srt/models/llama.py:917-918): the draft scores
            with the first ``draft_vocab_size`` rows of the target's embedding, not a trained
            lm_head. Read and kept (``check`` reports it as a finding), never refused.
        vocab_size: target vocab V (embedding rows, t2d length).
        draft_vocab_size: Vd (lm_head rows, d2t length).
        num_aux: K, number of aux slots concatenated into fc.
        target_hidden_size: target H (width of one aux slot).
        norm_before_fc / fc_norm / norm_output / norm_before_residual: the norm flags, meanings
            in ``specdiff.eagle3.norms.NORM_FLAGS``.
        hidden_act: only ``"silu"``.
        num_hidden_layers: N >= 1 decoder layers, chained as SGLang 0.5.23 does
            (srt/models/llama_eagle3.py:198-204 builds them, :253-265 chains them; see
            ``draft_model.Eagle3Draft``). Default 1 for configs built in code; a file must name it.
        lm_head_from_target: the config has no ``draft_vocab_size``, so SGLang loads the lm_head
            from the target (``load_lm_head_from_target``, llama_eagle3.py:306-308).
        max_position_embeddings: written back to config.json; not used by the forward.
        eagle_aux_hidden_state_layer_ids: native aux ids as configured (None = engine default).
        aux_convention: convention of those ids (``specdiff.eagle3.aux_layers``).
        source: the file it was read from (None = built in code); errors name it.
        format: the layout it was read from (None = built in code).
        defaults_used: field -> {"value", "source"} for each computation field the file lacked.
        notes: plain-words remarks (keys an engine ignores, flags SGLang does not implement).
        attention_windows: per decoder layer, the largest key distance its attention sees (None: full
            attention), or None when no layer has a window; counted by ``window_distance`` ("prefix":
            speculators' rule, "kv": SGLang's; eagle3/attention_window.py). From a file: the
            ``layer_types`` / ``sliding_window`` keys (speculators' rule).

    Raises:
        DraftConfigError: a value the draft forward cannot compute with.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    num_aux: int
    target_hidden_size: int
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    norm_before_residual: bool
    hidden_act: str = "silu"
    num_hidden_layers: int = 1
    lm_head_from_target: bool = False
    max_position_embeddings: int = 2048
    # absent from a file = the standard Llama rope SGLang assumes (getattr defaults, llama.py:199, :335);
    # not listed in defaults_used, which would carry them for every draft that never names them
    partial_rotary_factor: float = 1.0
    rope_is_neox_style: bool = True
    tie_word_embeddings: bool = False
    eagle_aux_hidden_state_layer_ids: list[int] | None = None
    aux_convention: str = "sglang"
    source: str | None = None
    format: str | None = None
    defaults_used: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    attention_windows: tuple | None = None
    window_distance: str = PREFIX

    def __post_init__(self):
        w = self.attention_windows
        if w is not None and (len(w) != self.num_hidden_layers or not all(
                x is None or (isinstance(x, int) and not isinstance(x, bool) and x >= 0) for x in w)):
            self._fail("attention_windows", f"is {w!r}", f"give one window (an integer >= 0, or null) per layer "
                       f"({self.num_hidden_layers})")
        if self.window_distance not in DISTANCES:
            self._fail("window_distance", f"is {self.window_distance!r}", f"give one of {', '.join(DISTANCES)}")
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "vocab_size", "draft_vocab_size", "num_aux", "target_hidden_size", "num_hidden_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                self._fail(name, f"is {v!r}", "give a positive integer")
        for name in NORM_FLAGS:
            if not isinstance(getattr(self, name), bool):
                self._fail(name, f"is {getattr(self, name)!r}", "give true or false")
        if self.hidden_act != "silu":
            self._fail("hidden_act", f"{self.hidden_act!r} is not supported", 'use "silu" (the only activation '
                       "the reference EAGLE-3 draft implements)")
        if self.num_attention_heads % self.num_key_value_heads:
            self._fail("num_key_value_heads", f"{self.num_key_value_heads} does not divide num_attention_heads "
                       f"{self.num_attention_heads}", "give a divisor of num_attention_heads")
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0):
            self._fail("rms_norm_eps", f"is {self.rms_norm_eps!r}", "give a positive number (Llama: 1e-5 or 1e-6)")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            self._fail("rope_theta", f"is {self.rope_theta!r}", "give a positive number (Llama: 10000 or 500000)")
        if not isinstance(self.rope_scaling or {}, dict):
            self._fail("rope_scaling", f"is {self.rope_scaling!r}",
                       'give an object such as {"rope_type": "linear", "factor": 2.0}, or null')
        kind = None if not self.rope_scaling else self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
        if kind not in ROPE_TYPES:
            self._fail("rope_scaling", f"type {kind!r} is not supported by the reference draft",
                       "use none, linear or llama3 rope scaling")
        prf = self.partial_rotary_factor
        if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 < prf <= 1:
            self._fail("partial_rotary_factor", f"is {prf!r}", "give a number in (0, 1] (1 = rotate every dim)")
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            self._fail("partial_rotary_factor", f"{prf} x head_dim {self.head_dim} rotates {self.rotary_dim} dims "
                       "(rope rotates pairs)", "give a factor that makes an even, non-zero number of dims")
        for name in ("rope_is_neox_style", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                self._fail(name, f"is {getattr(self, name)!r}", "give true or false")
        if kind in ("linear", "llama3") and "factor" not in self.rope_scaling:
            self._fail("rope_scaling", f"{kind} scaling without factor", "add rope_scaling.factor")
        factor = (self.rope_scaling or {}).get("factor")
        if kind in ("linear", "llama3") and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                             or not factor > 0):
            self._fail("rope_scaling", f"factor {factor!r}", "give rope_scaling.factor a positive number")
        if kind == "llama3" and "original_max_position_embeddings" not in self.rope_scaling:
            self._fail("rope_scaling", "llama3 scaling without original_max_position_embeddings",
                       "add rope_scaling.original_max_position_embeddings")

    # ---- derived -----------------------------------------------------------------------------
    @property
    def rotary_dim(self) -> int:
        """Dims of each head rope rotates: ``int(partial_rotary_factor * head_dim)`` (SGLang 0.5.23
        srt/models/llama.py:200)."""
        return int(self.partial_rotary_factor * self.head_dim)

    @property
    def aux_width(self) -> int:
        """K * H: width of the aux concat fed to fc."""
        return self.num_aux * self.target_hidden_size

    def norm_flags(self) -> dict[str, bool]:
        """name -> value of the norm flags (``specdiff.eagle3.norms.NORM_FLAGS``)."""
        return {name: getattr(self, name) for name in NORM_FLAGS}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def settings(self) -> dict:
        """``to_dict`` without where it was read from (source, format, defaults_used, notes): two
        configs that compute the same draft have equal settings."""
        d = self.to_dict()
        for k in _PROVENANCE:
            d.pop(k)
        return d

    def _key(self, name: str) -> str:
        """The config.json key of field ``name`` in this config's format."""
        if self.format is None:
            return name
        return _key_path(self.format, name)

    def _fail(self, name: str, problem: str, fix: str):
        raise DraftConfigError(field=self._key(name), file=self.source or "(built in code)", problem=problem,
                               fix=fix)

    # ---- reading -----------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> Eagle3DraftConfig:
        """Read ``path`` (a checkpoint directory or its config.json).

        Raises:
            CheckpointError: no such file / not JSON; DraftConfigError: see ``from_dict``.
        """
        f = Path(path)
        f = f / "config.json" if f.is_dir() or not f.suffix else f
        if not f.is_file():
            raise CheckpointError(f"{f.parent}: no config.json")
        try:
            raw = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{f}: not valid JSON ({e})") from None
        return cls.from_dict(raw, source=str(f))

    @classmethod
    def from_dict(cls, raw: dict, *, source: str = "config.json", fmt: str | None = None) -> Eagle3DraftConfig:
        """The config of a config.json dict in either format (detected when ``fmt`` is None), read by
        that format's reader (``draft_config_read.READERS``).

        Absent computation fields take the engine's value and are listed in ``defaults_used``
        (and logged): num_key_value_heads = heads, head_dim = Hd // heads, rms_norm_eps 1e-6,
        rope_theta 10000, rope_scaling none, hidden_act silu (transformers LlamaConfig);
        target_hidden_size = Hd (llama_eagle3.py:151-154); num_aux = number of ids, else 3
        (llama_eagle3.py:156-161); draft_vocab_size = V with the lm_head from the target
        (llama_eagle3.py:306-308); norm flags false (``specdiff.eagle3.norms``).

        Raises:
            DraftConfigError: an absent dim (num_hidden_layers too: SGLang would build transformers'
                default 32 layers), or a value the forward cannot compute with (field, ``source`` and fix in one line). ``tie_word_embeddings: true``
                is kept with a note (``specdiff check`` reports it with its fix), not refused.
            KeyError: ``fmt`` is not one of ``FORMATS``.
        """
        fmt = fmt or detect_format(raw, source=source)
        cfg = cls(**READERS[fmt](raw, source))
        for name, entry in cfg.defaults_used.items():
            log.info("draft config default: %s = %r (%s)", name, entry["value"], entry["source"])
        return cfg


    # ---- writing -----------------------------------------------------------------------------
    def to_json(self, fmt: str, *, aux_ids: list[int] | None, torch_dtype: str,
                verifier: str | None = None) -> dict:
        """The config.json dict in ``fmt`` ('specforge' or 'speculators').

        Args:
            aux_ids: native aux ids in ``fmt``'s convention (SGLang for specforge, vLLM for
                speculators; the caller converts), None = engine default.
            torch_dtype: dtype name of the weights written beside it (e.g. "bfloat16").
            verifier: speculators ``speculators_config.verifier.name_or_path``.

        Every computation field is written, so reading it back needs no default.

        Raises:
            DraftConfigError: unknown ``fmt``.
        """
        if fmt not in FORMATS:
            raise DraftConfigError(field="format", file=self.source or "(built in code)",
                                   problem=f"unknown draft format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
        if fmt == "speculators" and self.norm_before_fc and self.fc_norm:
            self._fail("fc_norm", "is true together with norm_before_fc, which speculators 0.9.0 refuses "
                       "(models/eagle3/config.py:90-95)", "write the specforge format (SGLang applies both) "
                       "or turn one of them off")
        dims = {
            "model_type": "llama", "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "num_hidden_layers": self.num_hidden_layers,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size, "hidden_act": self.hidden_act,
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.partial_rotary_factor != 1.0:
            dims["partial_rotary_factor"] = self.partial_rotary_factor
        if not self.rope_is_neox_style:
            dims["rope_is_neox_style"] = False
        dims["rope_scaling"] = self.rope_scaling
        if self.attention_windows is not None:  # speculators' keys (attention_window.config_windows)
            if self.window_distance != PREFIX:  # the keys would read back as another window at depth >= 1
                self._fail("window_distance", "is 'kv'", "serve SGLang's window with --speculative-draft-window-size")
            sizes = {w for w in self.attention_windows if w is not None}
            if len(sizes) != 1:
                self._fail("attention_windows", f"{self.attention_windows} has several sizes", "give every "
                           "windowed layer one size (a config holds one sliding_window)")
            dims["layer_types"] = ["full_attention" if w is None else "sliding_attention" for w in self.attention_windows]
            dims["sliding_window"] = sizes.pop() + 1
        if fmt == "specforge":
            conf = {"architectures": [SPECFORGE_ARCH], **dims}
        else:
            conf = {"architectures": [SPECULATORS_ARCHS[0]], "speculators_model_type": "eagle3",
                    "transformer_layer_config": dims}
        if not self.lm_head_from_target:
            conf["draft_vocab_size"] = self.draft_vocab_size
        conf["target_hidden_size"] = self.target_hidden_size
        if aux_ids is None or len(aux_ids) != self.num_aux:
            conf["num_aux_hidden_states"] = self.num_aux
        if fmt == "specforge":
            if aux_ids is not None:
                conf["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids)}
            write_norm_flags(conf, fmt, self.norm_flags())
        else:
            write_norm_flags(conf, fmt, self.norm_flags())
            conf["eagle_aux_hidden_state_layer_ids"] = None if aux_ids is None else list(aux_ids)
            conf["speculators_config"] = {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                          "verifier": {"name_or_path": verifier}}
        conf["torch_dtype"] = torch_dtype
        return conf

    def write(self, directory: str | Path, fmt: str, *, aux_ids: list[int] | None, torch_dtype: str,
              verifier: str | None = None) -> Path:
        """Write ``to_json(...)`` as ``directory/config.json``; returns its path."""
        f = Path(directory) / "config.json"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(self.to_json(fmt, aux_ids=aux_ids, torch_dtype=torch_dtype, verifier=verifier),
                                indent=2) + "\n")
        return f


def draft_config_from_dict(raw: dict, fmt: str | None = None, *,
                           source: str = "config.json") -> tuple[Eagle3DraftConfig, list[str]]:
    """``Eagle3DraftConfig.from_dict`` and its notes (raises DraftConfigError naming ``source``)."""
    cfg = Eagle3DraftConfig.from_dict(raw, source=source, fmt=fmt)
    return cfg, list(cfg.notes)
