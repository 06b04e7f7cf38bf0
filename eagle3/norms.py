"""EAGLE-3 draft norm flags: which config key turns on which RMSNorm, in each format, and what it computes.

The one place this is written down: the contract's meaning strings (``tracer.contract``), the
reference forward (``replay.model.draft_model``), the config reader/writer
(``replay.model.draft_config``) and the checks import it.

Where the flags act in the draft forward (K aux slots of target width H, draft width Hd)::

    x      = aux_cat                                    [N, K*H]
    x      = input_norm(x)          if norm_before_fc   one RMSNorm over the whole concat
    x      = cat(fc_norm[j](x_j))   if fc_norm          one RMSNorm per H-wide slot
    h      = fc(x)                                      [N, Hd]
    ...decoder layer: residual = hidden_norm(h) if norm_before_residual else h
    logits = lm_head(norm(out));  next depth gets norm(out) if norm_output else out

Read from (file:line of the installed/unpacked sources):

- SGLang 0.5.23 ``srt/models/llama_eagle3.py`` (what serves a ``specforge``-format config.json):
  ``norm_before_fc`` from ``eagle_config`` first, then the top level (173-175) -> ``input_norm``
  RMSNorm of width K*H (176-182); ``fc_norm`` or legacy ``use_aux_norm`` (185-187) -> K RMSNorms
  of width H (188-196); both applied when both are set, ``input_norm`` first (237-247);
  ``norm_output`` (207) picks the normed hidden as the one fed back (263-268); the decoder
  layer's residual is the un-normed hidden (97-102): ``norm_before_residual`` is not read.
- speculators 0.9.0 ``models/eagle3/config.py``: top-level ``norm_before_residual`` (43),
  ``norm_before_fc`` (58, "a single RMSNorm to the concatenated auxiliary hidden states"),
  ``fc_norm`` (66, "per-layer RMSNorm to each auxiliary hidden state"), ``norm_output`` (76,
  "feed post-norm hidden states back across TTT steps"); ``norm_before_fc`` and ``fc_norm``
  are refused together (90-95). ``core.py:122-139`` builds ``input_norm`` [K*H] / ``fc_norm``
  [H] x K, ``core.py:236-242`` applies them in SGLang's order, ``core.py:302-306`` feeds back
  the normed hidden under ``norm_output``; ``model_definitions.py:75-81`` sets the residual to
  ``hidden_norm(h)`` under ``norm_before_residual``.
- SpecForge 0.2.0 ``modeling/draft/llama3_eagle.py``: ``fc_norm`` (1679-1687, always 3 slots;
  applied in ``project_hidden_states`` 1762-1770); no ``norm_before_fc``; its ``norm_output``
  (1690, default True) means something else: whether ``compute_logits`` applies the final norm
  (1772-1777); the hidden fed back is always the pre-norm one
  (``algorithms/eagle3/model.py:386-400``). A SpecForge config's ``norm_output`` served by SGLang
  is therefore read with SGLang's meaning (see ``SPECFORGE_NORM_OUTPUT``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NormFlag", "NORM_FLAGS", "NORMS_OFF", "FORMATS", "SPECFORGE_NORM_OUTPUT", "read_norm_flags",
           "write_norm_flags", "apply_fc_norms", "fed_back_hidden", "meaning"]

#: checkpoint config.json layouts: ``specforge`` (SpecForge export, what SGLang serves) and ``speculators``
FORMATS = ("specforge", "speculators")


@dataclass(frozen=True)
class NormFlag:
    """One norm flag of the EAGLE-3 draft.

    Attributes:
        name: the flag's name (also the contract field and the draft config attribute).
        meaning: one line, what it computes when true (the contract's meaning string).
        weights: the weights it needs (names in SpecForge/SGLang layout, shapes).
        keys: format -> config.json keys read, first present wins (``a.b`` = key b inside
            dict a); an empty tuple: the format's engine does not implement the flag.
        sources: tool -> source file:line of the rule.
    """

    name: str
    meaning: str
    weights: str
    keys: dict[str, tuple[str, ...]]
    sources: dict[str, str]

    #: every format reads an absent flag as off (SGLang llama_eagle3.py:173-175,185-187,207;
    #: speculators eagle3/config.py field defaults)
    default: bool = False


NORM_BEFORE_FC = NormFlag(
    "norm_before_fc",
    "one RMSNorm (input_norm.weight [K*H]) over the whole aux concat before fc",
    "input_norm.weight [K*H]",
    {"specforge": ("eagle_config.norm_before_fc", "norm_before_fc"), "speculators": ("norm_before_fc",)},
    {"sglang": "SGLang 0.5.23 srt/models/llama_eagle3.py:173-182,239-240",
     "speculators": "speculators 0.9.0 models/eagle3/config.py:58, core.py:122-128,236-237",
     "specforge": "SpecForge 0.2.0: not implemented"})
FC_NORM = NormFlag(
    "fc_norm",
    "one RMSNorm per aux slot (fc_norm.{j}.weight [H]) before fc, after input_norm when both are set",
    "fc_norm.{j}.weight [H] for j < K (legacy aux_norm_low/mid/high)",
    {"specforge": ("fc_norm", "use_aux_norm"), "speculators": ("fc_norm",)},
    {"sglang": "SGLang 0.5.23 srt/models/llama_eagle3.py:185-196,241-246",
     "speculators": "speculators 0.9.0 models/eagle3/config.py:66, core.py:130-139,238-242",
     "specforge": "SpecForge 0.2.0 modeling/draft/llama3_eagle.py:1679-1687,1764-1769"})
NORM_OUTPUT = NormFlag(
    "norm_output",
    "the hidden fed to the next draft depth is the normed one (SGLang / speculators meaning)",
    "none",
    {"specforge": ("norm_output",), "speculators": ("norm_output",)},
    {"sglang": "SGLang 0.5.23 srt/models/llama_eagle3.py:207,263-268",
     "speculators": "speculators 0.9.0 models/eagle3/config.py:76, core.py:302-306",
     "specforge": "SpecForge 0.2.0 modeling/draft/llama3_eagle.py:1690,1772-1777: another meaning"})
NORM_BEFORE_RESIDUAL = NormFlag(
    "norm_before_residual",
    "the decoder layer's residual is hidden_norm(h), not h (speculators; SGLang 0.5.23 does not implement it)",
    "none",
    {"specforge": ("norm_before_residual",), "speculators": ("norm_before_residual",)},
    {"sglang": "SGLang 0.5.23 srt/models/llama_eagle3.py:97-102: not implemented (residual = h)",
     "speculators": "speculators 0.9.0 models/eagle3/config.py:43, model_definitions.py:75-81",
     "specforge": "SpecForge 0.2.0: not implemented for EAGLE-3 (P-EAGLE only)"})

#: name -> flag, in the order they act
NORM_FLAGS: dict[str, NormFlag] = {f.name: f for f in (NORM_BEFORE_FC, FC_NORM, NORM_OUTPUT, NORM_BEFORE_RESIDUAL)}

#: every norm flag off: what a config with none of the keys computes (``**NORMS_OFF`` at a call site)
NORMS_OFF: dict[str, bool] = {name: False for name in NORM_FLAGS}

#: SpecForge 0.2.0's own ``norm_output`` (llama3_eagle.py:1690,1772-1777): default True, means
#: "logits = lm_head(norm(h))", while the hidden fed back stays pre-norm. SGLang reads the same key
#: as "feed back the normed hidden"; neither SpecForge value serves what it trained with.
SPECFORGE_NORM_OUTPUT = ("SpecForge's norm_output means 'apply the final norm before lm_head' (default true; "
                         "the fed-back hidden stays pre-norm); SGLang reads the key as 'feed back the normed hidden'")


def meaning(name: str) -> str:
    """The one-line meaning of norm flag ``name`` (KeyError for an unknown flag)."""
    return NORM_FLAGS[name].meaning


_ABSENT = object()


def _lookup(raw: dict, key: str):
    head, _, tail = key.partition(".")
    if not tail:
        return raw.get(head, _ABSENT)
    inner = raw.get(head)
    return inner.get(tail, _ABSENT) if isinstance(inner, dict) else _ABSENT


def read_norm_flags(raw: dict, fmt: str) -> dict[str, tuple[bool, str | None]]:
    """The norm flags of a ``fmt`` config.json dict: name -> (value, key it was read from, or None
    when no key is present and the value is the default False).

    A present key counts even when false (SGLang's ``eagle_config.get("norm_before_fc", ...)``
    stops at a present false). Values are read with Python truthiness, as the engines do.

    Raises:
        KeyError: ``fmt`` is not one of ``FORMATS``.
    """
    out = {}
    for flag in NORM_FLAGS.values():
        value, where = flag.default, None
        for key in flag.keys[fmt]:
            v = _lookup(raw, key)
            if v is not _ABSENT:
                value, where = bool(v), key
                # fc_norm / use_aux_norm: SGLang ORs them (llama_eagle3.py:185-187), a false fc_norm
                # does not hide a true use_aux_norm
                if value or flag is not FC_NORM:
                    break
        out[flag.name] = (value, where)
    return out


#: flags a specforge-format config.json carries only when true: SpecForge 0.2.0 reads an explicit
#: ``norm_output: false`` as "no final norm before lm_head" (llama3_eagle.py:1690,1772-1777), a
#: computation SGLang never serves, while an absent key means the same draft to both
_SPECFORGE_ONLY_WHEN_TRUE = ("norm_output", "norm_before_residual")


def write_norm_flags(conf: dict, fmt: str, values: dict[str, bool]) -> None:
    """Write the norm flags ``values`` (name -> bool) into config.json dict ``conf`` in ``fmt``, each
    under its top-level name. speculators: every flag. specforge: ``norm_before_fc`` and
    ``fc_norm`` always (a reader needs no default); ``norm_output`` / ``norm_before_residual``
    only when true (``_SPECFORGE_ONLY_WHEN_TRUE``). ``norm_before_fc`` goes at the top level,
    not in ``eagle_config`` (which SGLang reads first), so that editing the top-level key works."""
    for flag in NORM_FLAGS.values():
        v = bool(values[flag.name])
        if fmt == "speculators" or v or flag.name not in _SPECFORGE_ONLY_WHEN_TRUE:
            conf[flag.name] = v


def apply_fc_norms(aux_cat, *, input_norm, fc_norm):
    """The fc input: ``aux_cat`` [..., K*H] through ``input_norm`` (a module over K*H, or None),
    then the per-slot ``fc_norm`` (a sequence of K modules over H, or None), in SGLang's order
    (llama_eagle3.py:239-246; speculators core.py:236-242). Returns [..., K*H]."""
    import torch

    x = aux_cat
    if input_norm is not None:
        x = input_norm(x)
    if fc_norm is not None:
        x = torch.cat([n(c) for n, c in zip(fc_norm, x.chunk(len(fc_norm), dim=-1))], dim=-1)
    return x


def fed_back_hidden(hidden_out, normed, *, norm_output: bool):
    """The hidden the next draft depth consumes: ``normed`` under ``norm_output`` else the pre-norm
    ``hidden_out`` (SGLang llama_eagle3.py:263-268; speculators core.py:302-306)."""
    return normed if norm_output else hidden_out
