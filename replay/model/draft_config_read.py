"""Reading a draft config.json dict: one reader per checkpoint format, and the errors a read raises.

``Eagle3DraftConfig.from_dict`` (replay/model/draft_config.py) picks the reader of the format
(``READERS``); each returns the keyword arguments of the config. What the formats share (the
required dims, the values an engine fills in for an absent key, the aux count, the norm flags,
the attention windows) is ``_Reading``, which each reader drives in the same order:

- ``specforge`` (SpecForge export, what SGLang 0.5.23 serves): the Llama dims at the top level,
  aux ids only in ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang convention; a
  top-level key is ignored by SGLang, llama_eagle3.py:156-161).
- ``speculators`` (speculators 0.9.0 ``models/eagle3/config.py``): the Llama dims in
  ``transformer_layer_config``, top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM convention).

An absent computation field takes the engine's value and is listed in ``defaults_used``
(name -> {value, source}); an absent dim is an error naming the field, the file and the fix.
"""

from __future__ import annotations

from collections.abc import Callable

from specdiff.eagle3.attention_window import config_windows
from specdiff.eagle3.norms import NORM_FLAGS, read_norm_flags
from specdiff.replay.model.rope_config import LLAMA_DEFAULT as _LLAMA
from specdiff.replay.model.rope_config import rope_params
from specdiff.tracer.errors import SpecdiffError

__all__ = ["CheckpointError", "DraftConfigError", "READERS"]

#: the dims no engine fills in: absent = error
_REQUIRED = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "num_hidden_layers")


class CheckpointError(SpecdiffError):
    """A draft checkpoint that cannot be loaded as an EAGLE-3 draft (one clear line)."""


class DraftConfigError(CheckpointError):
    """A draft config.json field that is missing or wrong: says which field, which file, the fix.

    Attributes: ``field`` (the config.json key, ``a.b`` = key b inside a), ``file``, ``fix``.
    """

    def __init__(self, *, field: str, file: str, problem: str, fix: str):
        self.field, self.file, self.fix = field, file, fix
        super().__init__(f"draft config {file}: {field}: {problem}; fix: {fix}")


class _Reading:
    """One config.json being read in format ``fmt``: the steps every format takes, in order.

    Construction checks the dims in ``dims`` (the dict holding the Llama keys) and fills in the
    attention shape, eps, activation and rope; ``aux`` then the aux ids, their count, the target
    width and the draft vocab; ``norm_flags`` the flags; ``fields`` the windows and the result.
    ``notes`` and ``defaults`` grow as it goes (their order is what the config keeps).

    Raises:
        DraftConfigError: ``dims`` is not a dict (read as a missing ``transformer_layer_config``),
            a required dim is absent or not a positive integer.
    """

    def __init__(self, raw: dict, dims, source: str, fmt: str):
        if not isinstance(dims, dict):
            raise DraftConfigError(field="transformer_layer_config", file=source, problem="is missing",
                                   fix="add the draft's Llama dims under transformer_layer_config")
        self.raw, self.dims, self.source, self.fmt = raw, dims, source, fmt
        self.defaults: dict[str, dict] = {}
        self.notes: list[str] = []
        for name in _REQUIRED:
            if name not in dims:
                fix = ('add "num_hidden_layers", the number of decoder layers the draft was trained with '
                       '(without it SGLang builds transformers\' default 32 layers)'
                       if name == "num_hidden_layers" else f"add {name} (the draft's {name} as trained)")
                raise DraftConfigError(field=_key_path(fmt, name), file=source, problem="is missing", fix=fix)
            if isinstance(dims[name], bool) or not isinstance(dims[name], int) or dims[name] < 1:
                raise DraftConfigError(field=_key_path(fmt, name), file=source, problem=f"is {dims[name]!r}",
                                       fix="give a positive integer")
        self.tied = bool(raw.get("tie_word_embeddings") or dims.get("tie_word_embeddings"))
        if self.tied:
            self.notes.append("tie_word_embeddings is true: SGLang 0.5.23 scores the draft with the target's "
                              "embedding (llama_eagle3.py:303-304, llama.py:917-918), not lm_head.weight")
        hd, heads = dims["hidden_size"], dims["num_attention_heads"]
        self.kv = self._dim("num_key_value_heads", heads, f"num_attention_heads ({_LLAMA})")
        self.head_dim = self._dim("head_dim", hd // heads if isinstance(heads, int) and heads else None,
                                  f"hidden_size // num_attention_heads ({_LLAMA}; SGLang llama.py LlamaAttention)")
        self.eps = self._dim("rms_norm_eps", 1e-6, _LLAMA)
        self.act = self._dim("hidden_act", "silu", _LLAMA)
        self.theta, self.scaling = rope_params(dims, self._default)

    def _default(self, name: str, value, why: str):
        self.defaults[name] = {"value": value, "source": f"absent from {self.source}: {why}"}
        return value

    def _dim(self, name: str, fallback, why: str):
        if self.dims.get(name) is not None:
            return self.dims[name]
        return self._default(name, fallback, why)

    def aux(self, ids, *, field: str, convention: str) -> None:
        """Take the aux ids ``ids`` (read from ``field``, in ``convention``) and fill in the aux
        count, the target hidden size and the draft vocab (SGLang 0.5.23 llama_eagle3.py)."""
        _check_ids(ids, field=field, source=self.source)
        self.ids, self.convention = ids, convention
        raw, hd = self.raw, self.dims["hidden_size"]
        if raw.get("num_aux_hidden_states") is not None:
            self.num_aux = raw["num_aux_hidden_states"]
        elif ids:
            self.num_aux = len(ids)  # SGLang llama_eagle3.py:159-161: the number of configured ids
        else:
            self.num_aux = self._default("num_aux", 3, "no num_aux_hidden_states and no aux ids: SGLang 0.5.23 "
                                                       "llama_eagle3.py:156-161 uses 3")
        th = raw.get("target_hidden_size", self.dims.get("target_hidden_size"))
        if th is None:
            th = self._default("target_hidden_size", hd,
                               "the draft hidden_size (SGLang 0.5.23 llama_eagle3.py:151-154)")
        self.target_hidden_size = th
        dvs = raw.get("draft_vocab_size")
        if dvs is None:
            dvs = self._default("draft_vocab_size", self.dims["vocab_size"], "vocab_size, lm_head from the target "
                                                                             "(SGLang 0.5.23 llama_eagle3.py:306-308)")
        self.draft_vocab_size = dvs

    def norm_flags(self, engine: str) -> dict[str, bool]:
        """The norm flags (``specdiff.eagle3.norms``); an absent one is off, as ``engine`` reads it."""
        self.flags = {}
        for name, (value, key) in read_norm_flags(self.raw, self.fmt).items():
            self.flags[name] = value
            if key is None:
                self._default(name, value, f"off ({NORM_FLAGS[name].sources[engine]})")
        if self.flags["norm_before_residual"]:
            self.notes.append("norm_before_residual=true (speculators): SGLang 0.5.23 does not implement it")
        return self.flags

    def fields(self) -> dict:
        """The keyword arguments of ``Eagle3DraftConfig``, attention windows included.

        Raises:
            DraftConfigError: the window keys cannot be read (``eagle3.attention_window.config_windows``).
        """
        dims, fmt, source = self.dims, self.fmt, self.source
        try:
            windows = config_windows(dims, dims["num_hidden_layers"])
        except ValueError as e:
            raise DraftConfigError(field=_key_path(fmt, "layer_types"), file=source, problem=str(e).split("; ")[0],
                                   fix=str(e).split("; ", 1)[-1]) from None
        return dict(hidden_size=dims["hidden_size"], intermediate_size=dims["intermediate_size"],
                    num_attention_heads=dims["num_attention_heads"], num_key_value_heads=self.kv,
                    head_dim=self.head_dim, vocab_size=dims["vocab_size"], draft_vocab_size=self.draft_vocab_size,
                    rms_norm_eps=self.eps, rope_theta=self.theta, rope_scaling=self.scaling, num_aux=self.num_aux,
                    target_hidden_size=self.target_hidden_size, hidden_act=self.act,
                    num_hidden_layers=dims["num_hidden_layers"],
                    lm_head_from_target="draft_vocab_size" in self.defaults,
                    max_position_embeddings=int(dims.get("max_position_embeddings", 2048)),
                    partial_rotary_factor=dims.get("partial_rotary_factor", 1.0),
                    rope_is_neox_style=dims.get("rope_is_neox_style", True), tie_word_embeddings=self.tied,
                    eagle_aux_hidden_state_layer_ids=None if self.ids is None else [int(i) for i in self.ids],
                    aux_convention=self.convention, source=source, format=fmt, defaults_used=self.defaults,
                    notes=self.notes, attention_windows=windows, **self.flags)


def _read_specforge(raw: dict, source: str) -> dict:
    """A SpecForge export: dims at the top level, aux ids in ``eagle_config`` (SGLang convention)."""
    r = _Reading(raw, raw, source, "specforge")
    if not isinstance(raw.get("eagle_config") or {}, dict):
        raise DraftConfigError(field="eagle_config", file=source, problem=f"is {raw['eagle_config']!r}",
                               fix='give an object, e.g. {"eagle_aux_hidden_state_layer_ids": [-1, 2, 5]}')
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None and raw.get("eagle_aux_hidden_state_layer_ids") is not None:
        r.notes.append("top-level eagle_aux_hidden_state_layer_ids "
                       f"{raw['eagle_aux_hidden_state_layer_ids']} is ignored by SGLang "
                       "(it reads only eagle_config.eagle_aux_hidden_state_layer_ids)")
    r.aux(ids, field="eagle_config.eagle_aux_hidden_state_layer_ids", convention="sglang")
    r.norm_flags("sglang")
    return r.fields()


def _read_speculators(raw: dict, source: str) -> dict:
    """A speculators config: dims in ``transformer_layer_config``, top-level aux ids (vLLM convention)."""
    r = _Reading(raw, raw.get("transformer_layer_config"), source, "speculators")
    r.aux(raw.get("eagle_aux_hidden_state_layer_ids"), field="eagle_aux_hidden_state_layer_ids",
          convention="speculators")
    flags = r.norm_flags("speculators")
    if flags["norm_before_fc"] and flags["fc_norm"]:
        r.notes.append("norm_before_fc and fc_norm are both true: speculators 0.9.0 refuses the pair "
                       "(models/eagle3/config.py:90-95); SGLang applies input_norm, then fc_norm")
    return r.fields()


#: format -> its reader: (config.json dict, source) -> ``Eagle3DraftConfig`` keyword arguments
READERS: dict[str, Callable[[dict, str], dict]] = {"specforge": _read_specforge, "speculators": _read_speculators}


def _key_path(fmt: str, name: str) -> str:
    """config.json key of a config field in ``fmt`` (dims live in transformer_layer_config in speculators)."""
    if name in NORM_FLAGS:
        return NORM_FLAGS[name].keys[fmt][0]
    if name == "num_aux":
        return "num_aux_hidden_states"
    if name == "attention_windows":  # read from two keys (eagle3/attention_window.py config_windows)
        inner = "" if fmt == "specforge" else "transformer_layer_config."
        return f"{inner}layer_types / {inner}sliding_window"
    if name in ("draft_vocab_size", "target_hidden_size") or fmt == "specforge":
        return name
    return f"transformer_layer_config.{name}"


def _check_ids(ids, *, field: str, source: str) -> None:
    """Refuse aux ids that are not a JSON list of ints (``"2,5,6"``, ``[1.5]``, ``5``); None passes.

    Raises:
        DraftConfigError: naming ``field`` and, for a string of ints, the list to write instead.
    """
    if ids is None or (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        return
    items = ids.replace(" ", "").split(",") if isinstance(ids, str) else []
    example = (f"[{', '.join(items)}]" if items and all(i.lstrip("-").isdigit() for i in items) else "[2, 5, 6]")
    raise DraftConfigError(field=field, file=source, problem=f"is {ids!r}, not a list of integers",
                           fix=f"write a JSON list of integers, e.g. {example}")
