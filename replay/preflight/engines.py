"""What each engine makes of a draft from its config alone: what it will capture from the target
and feed the draft's fc, and the context length and dtype SGLang serves it with.

Owns: how many fc slots each engine builds and the outcome (ok / crash / fc skipped / unsupported
format); SGLang's derived context length and served dtype (``sglang_context_length``,
``sglang_served_dtype``). Where each engine reads the aux ids is
``specdiff.eagle3.config_ids.config_aux_ids`` (SGLang: ``eagle_config`` only; vLLM V1: top level,
else ``eagle_config``, else ``dflash_config``; vLLM V2 never reads ``eagle_config``'s ids) and what
an id captures is ``engine_capture``; this module only applies them to a draft config.

- SGLang 0.5.23 reads aux ids only from ``eagle_config.eagle_aux_hidden_state_layer_ids``
  (spec_aux_hidden_state.py:185-196; a list, even empty, is used as given, no key = default).
  fc is built for K = ``num_aux_hidden_states`` / len(eagle ids) / 3 slots
  (llama_eagle3.py:156-161) and is *skipped* when the aux width equals the draft hidden
  (llama_eagle3.py:238). There is no model class for the speculators format.
- What SGLang captures from the ids depends on the target's architecture (per model file:
  plus-one, deepseek, gpt-oss; ``specdiff.eagle3.families.sglang_family_rule``).
- vLLM 0.32.0's V1 runner reads the top-level ``eagle_aux_hidden_state_layer_ids`` and, when that
  is absent or empty, ``eagle_config``'s (v1/worker/gpu_model_runner.py:5268-5283). fc is built
  for K = ``num_aux_hidden_states`` / len(eagle_config ids) / 3 (llama_eagle3.py:209-216): the
  top-level ids are not counted. The crash with a missing slot is in the words of the kernel fc runs
  on (``VLLM.slot_crash``: AMX's packed linear, oneDNN's reshape or torch's matmul, by the CPU).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specdiff.eagle3.aux_layers import ConventionError, engine_capture
from specdiff.eagle3.config_ids import ConfigIds, config_aux_ids
from specdiff.eagle3.config_keys import KEY_NESTED, KEY_TOP
from specdiff.eagle3.engines import REGISTRY, EngineSpec
from specdiff.replay.preflight.files import PreflightError

__all__ = ["ENGINE_NAME", "EngineCapture", "resolve_engine_capture", "fc_slots", "checked_specs",
           "read_config_ids", "hf_label", "fmt_hf", "sglang_context_length", "sglang_served_dtype"]

#: engine name (a finding's ``engine``, 'all' for every engine) -> how a report names it
ENGINE_NAME = {**{name: spec.title for name, spec in REGISTRY.items()}, "all": "all engines"}


def checked_specs(engines) -> list[EngineSpec]:
    """The ``EngineSpec`` of each registered engine in ``engines`` (names, e.g. ('sglang', 'vllm')), in
    the order given; other names are skipped (the rules judge only the engines specdiff knows)."""
    return [REGISTRY[e] for e in engines if e in REGISTRY]


@dataclass(frozen=True)
class EngineCapture:
    """What one engine will capture from the target and feed the draft's fc.

    Attributes:
        engine: 'sglang' or 'vllm'.
        source: where the ids were read: 'eagle_config', 'top-level' or 'default'.
        native_ids: the ids as read (None = default).
        convention: how the engine reads them ('sglang' or 'vllm').
        hf_indices: HF hidden_states indices that arrive, in concat (ascending) order.
        dropped_ids: native ids that are never captured.
        slots_expected: K, the slots fc is built for.
        outcome: 'ok', 'crash', 'fc-skipped' or 'unsupported'.
        prenorm_ids: native ids captured as the last decoder layer's output before the final
            norm (vLLM id L, GPT-OSS capture index L): a slot that arrives after the HF ones and
            that no HF index holds.
        failure: what the engine does beyond a missing slot ('' = nothing): SGLang's IndexError
            at start or RuntimeError on the first request (``CapturePlan.failure``).
        family: the SGLang family rule's name ('' for vLLM or without an architecture).
        family_known: False when the architecture is not in the table and plus-one was assumed.
        notes: the rule assumed, family caveats (``CapturePlan.notes``).
    """

    engine: str
    source: str
    native_ids: tuple[int, ...] | None
    convention: str
    hf_indices: tuple[int, ...]
    dropped_ids: tuple[int, ...]
    slots_expected: int
    outcome: str
    prenorm_ids: tuple[int, ...] = ()
    failure: str = ""
    family: str = ""
    family_known: bool = True
    notes: tuple[str, ...] = ()

    @property
    def slots(self) -> int:
        """Slots that arrive at fc (HF ones plus a pre-norm one)."""
        return len(self.hf_indices) + (1 if self.prenorm_ids else 0)

    def as_dict(self) -> dict:
        """JSON-safe dict; ``prenorm_ids``, ``failure``, ``family``, ``family_known`` and ``notes``
        only when set (the JSON of every other capture stays as it was before the keys existed)."""
        d = dataclasses.asdict(self)
        for k in ("prenorm_ids", "failure", "family", "notes"):
            if not d[k]:
                del d[k]
        if not self.family:
            del d["family_known"]
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


def hf_label(i: int, L: int) -> str:
    """Plain name of HF hidden_states[i]."""
    if i == 0:
        return "embed"
    if i == L:
        return "final-norm"
    return f"out L{i - 1}"


def fmt_hf(indices, L: int) -> str:
    """``[0 (embed), 4 (out L3)]``: HF indices with their plain names."""
    return "[" + ", ".join(f"{i} ({hf_label(i, L)})" for i in indices) + "]"


#: how findings name where the ids were read (``EngineCapture.source``); other keys by their full name
SHORT_SOURCE = {KEY_TOP: "top-level", KEY_NESTED: "eagle_config", None: "default"}


def read_config_ids(engine: str, raw: dict, runner: str | None = None) -> ConfigIds:
    """``eagle3.config_ids.config_aux_ids`` with a bad id list as a ``PreflightError`` (one line)."""
    try:
        return config_aux_ids(engine, raw, runner=runner)
    except ConventionError as e:
        raise PreflightError(str(e)) from None


def fc_slots(raw: dict) -> int:
    """K as SGLang and vLLM build the draft's fc from its config: ``num_aux_hidden_states``, else
    the number of ``eagle_config`` ids, else 3 (SGLang 0.5.23 llama_eagle3.py:156-161; vLLM 0.32.0
    model_executor/models/llama_eagle3.py:209-216: neither counts the top-level ids)."""
    k = raw.get("num_aux_hidden_states")
    if k is None:
        ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        k = len(ids) if ids else 3
    return int(k)


def resolve_engine_capture(engine: str, *, raw: dict, fmt: str, num_layers: int, k_fc: int,
                           aux_width: int, draft_hidden: int, architecture: str | None = None,
                           runner: str | None = None) -> EngineCapture:
    """What ``engine`` captures for this draft config on an L-layer target.

    Args:
        raw: the draft's config.json.
        fmt: 'specforge' or 'speculators'.
        architecture: the target's HF architecture (its SGLang rule); None: the Llama rule.
        runner: vLLM's model runner whose key precedence applies ('v1' default, 'v2').
        k_fc: slots fc expects; aux_width: width per slot (target H); draft_hidden: Hd (SGLang
            skips fc when the arriving width equals it).

    Raises:
        PreflightError: ids that are not a list of ints, an unknown runner.
    """
    read = read_config_ids(engine, raw, runner)
    if fmt not in REGISTRY[engine].checkpoint_formats:  # SGLang has no model class for the speculators layout
        return EngineCapture(engine, "none", None, engine, (), (), k_fc, "unsupported")
    ids, source = read.ids, SHORT_SOURCE.get(read.key, read.key)
    plan = engine_capture(engine, ids, num_layers=num_layers, architecture=architecture)
    fam = plan.rule
    extra = dict(failure=plan.failure, notes=plan.notes,
                 family=fam.name if fam is not None else "", family_known=fam.known if fam is not None else True)
    if plan.failure:
        outcome = "crash"
    elif plan.slots == k_fc:
        outcome = "ok"
    elif REGISTRY[engine].fc_skip_at_width and plan.slots * aux_width == draft_hidden:
        outcome = "fc-skipped"
    else:
        outcome = "crash"
    return EngineCapture(engine, source, ids, engine, plan.hf_indices, plan.dropped, k_fc, outcome,
                         plan.prenorm, **extra)


def sglang_context_length(config: dict) -> int:
    """The context length SGLang 0.5.23 derives from a config dict (srt/utils/hf_transformers/common.py:
    668-695 ``get_context_length``): the first of max_sequence_length, seq_length, max_seq_len,
    model_max_length, max_position_embeddings, times rope_scaling's ``factor`` unless the scaling
    names original_max_position_embeddings or is llama3; 2048 when none is set."""
    rs = config.get("rope_scaling") or None
    factor = 1
    if isinstance(rs, dict) and "original_max_position_embeddings" not in rs and rs.get("rope_type") != "llama3":
        factor = rs.get("factor", 1)
    for key in ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings"):
        if config.get(key) is not None:
            return int(factor * config[key])
    return 2048


def sglang_served_dtype(config: dict, dtype: str = "auto") -> str:
    """The dtype SGLang 0.5.23 runs a model in for ``--dtype dtype`` (srt/configs/model_config.py:
    2284-2325 ``_get_and_verify_dtype``): ``auto`` takes the config's ``dtype`` / ``torch_dtype``, but
    a float32 or absent one becomes float16 (bfloat16 for Gemma models)."""
    if dtype != "auto":
        return {"half": "float16", "float": "float32", "bf16": "bfloat16"}.get(dtype, dtype)
    cdt = config.get("dtype") or config.get("torch_dtype") or "float32"
    if str(cdt).replace("torch.", "") in ("float32", "float"):
        return "bfloat16" if str(config.get("model_type", "")).startswith("gemma") else "float16"
    return str(cdt).replace("torch.", "")
