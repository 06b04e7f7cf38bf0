"""vLLM 0.32.0's own aux-id rules: which key its V1 runner reads the ids from and in what
numbering (id k = HF k), SGLang-numbered ids it reads literally, keys it never reads or reads
second, what the V2 runner (the GPU default) would take instead, and an fc built for another
slot count than fc.weight holds. The key precedence is ``eagle3.config_ids.config_aux_ids``.
"""

from __future__ import annotations

from specdiff.eagle3.aux_layers import ConventionError, engine_capture, resolve_aux_ids
from specdiff.eagle3.config_ids import ConfigIds, config_aux_ids
from specdiff.eagle3.config_keys import ENGINE_ID_KEYS, KEY_NESTED, KEY_TOP, PLUS_ONE_KEYS
from specdiff.replay.preflight.engines import EngineCapture, fc_slots, fmt_hf, read_config_ids
from specdiff.replay.preflight.report import Finding
from specdiff.replay.preflight.rules.wording import sglang_rule_words, slots_text

__all__ = ["check_vllm_ids"]


def _v_hf(ids, L: int, architecture: str | None) -> tuple[int, ...]:
    """HF indices vLLM captures for its ids (None: its default), HF ones only."""
    return engine_capture("vllm", ids, num_layers=L, architecture=architecture).hf_indices


def _runner_keys(read) -> str:
    keys = [k + (" (+1)" if k in PLUS_ONE_KEYS else "") for k in ENGINE_ID_KEYS[(read.engine, read.runner)]]
    return ", else ".join(keys)


def _only(key: str, ids) -> dict:
    """A config dict holding only ``key`` = ``ids`` (what the ids in that key mean to a runner that reads it)."""
    parts = key.removeprefix("top-level ").split(".")
    d: dict = {parts[-1]: list(ids)}
    for p in reversed(parts[:-1]):
        d = {p: d}
    return d


def _sglang_numbered(cap: EngineCapture, v1: ConfigIds, *, L: int, top_fix_ids: list[int] | None,
                     architecture: str | None) -> tuple[list[Finding], list[int] | None]:
    """``aux.sglang_ids``: eagle_config ids in SGLang's numbering that V1 reads literally; with the
    HF indices they were meant as (None when V1 does not misread them)."""
    if v1.key != KEY_NESTED:
        return [], None
    try:
        sg = resolve_aux_ids(list(v1.ids), convention="sglang", num_layers=L, architecture=architecture)
    except ConventionError:
        sg = None
    if sg is None or sg.dropped or sg.hf_indices == cap.hf_indices:
        return [], None
    want = top_fix_ids if top_fix_ids is not None else list(sg.hf_indices)
    neg = [i for i in v1.ids if i < 0]
    effect = (f"id {neg[0]} matches no layer, so {cap.slots} of {cap.slots_expected} slots reach fc and the "
              "first request crashes" if neg and cap.outcome == "crash" else
              f"vLLM feeds HF {slots_text(cap, L)}, SGLang HF {fmt_hf(sg.hf_indices, L)} from the same key")
    return [Finding("aux.sglang_ids", "error" if neg or cap.outcome == "crash" else "warn", "vllm",
                    f"eagle_config ids {list(v1.ids)} read in SGLang's numbering are HF "
                    f"{fmt_hf(sg.hf_indices, L)} ({sglang_rule_words(architecture)}), but "
                    f"{v1.who} reads eagle_config's ids literally (id k = HF k): {effect}",
                    f"add top-level eagle_aux_hidden_state_layer_ids = {want} (vLLM id k = HF k; vLLM "
                    "reads it before eagle_config, SGLang ignores it)")], want


def _unread_keys(cap: EngineCapture, v1: ConfigIds, *, L: int, top_fix_ids: list[int] | None,
                 meant_hf: list[int] | None, architecture: str | None) -> tuple[list[Finding], list[int] | None]:
    """``aux.shadowed_key`` / ``aux.ignored_key`` for ids in a key V1 reads second or never; with
    ``meant_hf`` filled from the first ignored key V1 fell back past, when still unknown."""
    out: list[Finding] = []
    for key, ids in v1.unread:
        if key == KEY_NESTED and v1.key == KEY_TOP:
            continue  # both keys written, one per engine: the usual layout (aux.conflicting_keys compares them)
        if v1.read_by(key):
            out.append(Finding("aux.shadowed_key", "warn", "vllm",
                               f"{key} {list(ids)} is not used: {v1.who} takes "
                               + (f"{v1.key} first" if v1.key else "no ids because eagle_config is a dict without "
                                  "eagle_aux_hidden_state_layer_ids, which replaces dflash_config's ids "
                                  "(gpu_model_runner.py:5279-5280)")
                               + f" ({_runner_keys(v1)})",
                               "keep the aux ids in one key: top-level eagle_aux_hidden_state_layer_ids"))
            continue
        meant = config_aux_ids("vllm", _only(key, ids), runner="v2").ids or tuple(ids)
        try:
            key_hf = _v_hf(meant, L, architecture)
        except ConventionError:
            key_hf = None
        fell = v1.key is None
        got = f"it falls back to its default HF {fmt_hf(cap.hf_indices, L)}: {v1.fallback}" if fell else \
            f"it takes {v1.key} instead"
        sev = "error" if fell and key_hf is not None and key_hf != cap.hf_indices else "warn" if fell else "info"
        fix_ids = top_fix_ids if top_fix_ids is not None else list(meant) if key_hf is not None else None
        if fell and key_hf is not None and meant_hf is None:
            meant_hf = list(meant)
        out.append(Finding("aux.ignored_key", sev, "vllm",
                           f"{key} {list(ids)} is not a key {v1.who} reads ({_runner_keys(v1)}; {v1.sources}): {got}",
                           "write the ids at the top level in vLLM's numbering (id k = HF k)"
                           + (f": top-level eagle_aux_hidden_state_layer_ids = {fix_ids}" if fix_ids else "")))
    return out, meant_hf


def _runner_differs(cap: EngineCapture, v1: ConfigIds, *, raw: dict, L: int, top_fix_ids: list[int] | None,
                    meant_hf: list[int] | None, architecture: str | None) -> list[Finding]:
    """``aux.runner_differs``: the V2 runner (GPU default, never reads eagle_config's ids) takes
    other ids than V1."""
    v2 = read_config_ids("vllm", raw, "v2")
    if v2.ids == v1.ids:
        return []
    try:
        hf2 = fmt_hf(_v_hf(v2.ids, L, architecture), L)
    except ConventionError:
        hf2 = f"ids {list(v2.ids or ())}"
    took = (f"reads {v2.key} {list(v2.ids)}: HF {hf2}" if v2.key else
            f"reads none of its keys ({_runner_keys(v2)}): {v2.fallback}, HF {hf2}")
    fix_ids = (top_fix_ids if top_fix_ids is not None else meant_hf if meant_hf is not None
               else list(cap.hf_indices) if cap.outcome == "ok" and not cap.prenorm_ids else None)
    return [Finding("aux.runner_differs", "warn", "vllm",
                    f"on a GPU vLLM 0.32's default model runner V2 (config/vllm.py:722-738; {v2.sources}) "
                    f"{took}; V1 (the CPU build, or VLLM_USE_V2_MODEL_RUNNER=0) feeds HF {slots_text(cap, L)}"
                    + (f" from {v1.key}" if v1.key else ""),
                    "write the ids at top-level eagle_aux_hidden_state_layer_ids, which both runners read first"
                    + (f": {fix_ids} (vLLM id k = HF k)" if fix_ids else ""))]


def _fc_width(raw: dict, k_weights: int) -> list[Finding]:
    """``aux.fc_width``: fc built for another slot count than fc.weight holds (loading fails)."""
    k_cfg = fc_slots(raw)
    if k_cfg == k_weights:
        return []
    why = ("num_aux_hidden_states" if raw.get("num_aux_hidden_states") is not None else
           "the number of eagle_config ids" if (raw.get("eagle_config") or {}).get(
               "eagle_aux_hidden_state_layer_ids") else "its default 3: no num_aux_hidden_states, no eagle_config ids")
    return [Finding("aux.fc_width", "error", "vllm",
                    f"vLLM builds fc for {k_cfg} aux slots ({why}; llama_eagle3.py:209-216 does not count the "
                    f"top-level ids) but fc.weight holds {k_weights}: loading the draft fails on fc's shape",
                    f"set num_aux_hidden_states = {k_weights} in the draft config")]


def check_vllm_ids(cap: EngineCapture, *, raw: dict, num_layers: int, k_weights: int,
                   training_hf: tuple[int, ...] | None = None, architecture: str | None = None) -> list[Finding]:
    """vLLM 0.32.0's own aux-id findings (engine 'vllm'), from the one key-precedence rule
    (``eagle3.config_ids.config_aux_ids``):

    - ``aux.source`` (info): the key the V1 runner read, its precedence and the numbering (id k = HF k);
    - ``aux.sglang_ids``: ``eagle_config`` ids written in SGLang's numbering that vLLM reads
      literally (error when they hold -1: no layer matches, the first request crashes; warn otherwise:
      every layer shifted);
    - ``aux.ignored_key`` / ``aux.shadowed_key``: ids in a key the V1 runner never reads (the
      fallback it takes instead is named) or one a key it reads first overrides;
    - ``aux.runner_differs``: the V2 runner (GPU default) would take other ids (it never reads
      ``eagle_config.eagle_aux_hidden_state_layer_ids``);
    - ``aux.fc_width``: fc built for another slot count than fc.weight holds (llama_eagle3.py:209-216
      counts ``num_aux_hidden_states`` or the nested ids only): loading fails.
    """
    if cap.outcome == "unsupported":
        return []
    L = num_layers
    v1 = read_config_ids("vllm", raw, "v1")
    out: list[Finding] = []
    top_fix_ids = list(training_hf) if training_hf is not None and max(training_hf) < L else None
    if v1.key is not None:
        out.append(Finding("aux.source", "info", "vllm",
                           f"{v1.who} reads the aux ids {list(v1.ids)} from {v1.key} (its precedence: "
                           f"{_runner_keys(v1)}; {v1.sources}); vLLM id k = HF hidden_states[k] -> HF "
                           f"{slots_text(cap, L)}", ""))
    # meant_hf: what the ids mean when V1 misreads them (SGLang numbering, or a key it fell back past)
    found, meant_hf = _sglang_numbered(cap, v1, L=L, top_fix_ids=top_fix_ids, architecture=architecture)
    out += found
    found, meant_hf = _unread_keys(cap, v1, L=L, top_fix_ids=top_fix_ids, meant_hf=meant_hf,
                                   architecture=architecture)
    out += found
    out += _runner_differs(cap, v1, raw=raw, L=L, top_fix_ids=top_fix_ids, meant_hf=meant_hf,
                           architecture=architecture)
    out += _fc_width(raw, k_weights)
    return out
