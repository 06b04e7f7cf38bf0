"""The pre-flight rule families: each takes what ``files`` read and ``engines`` resolved and
returns ``Finding`` rows (aux capture, training layers, weights, vocab map, norms, rope,
speculative algorithm, tokenizer). Pure functions of their inputs; the EAGLE-3 facts they apply
come from ``specdiff.eagle3`` (aux ids, vocab map) and ``replay.model.checkpoint`` (weight names
and shapes).
"""

from __future__ import annotations

import dataclasses
import json

import torch

from specdiff.eagle3.aux_layers import (
    ConventionError,
    default_hf_indices,
    engine_capture,
    native_aux_ids,
    resolve_aux_ids,
)
from specdiff.eagle3.config_ids import config_aux_ids
from specdiff.eagle3.config_keys import ENGINE_ID_KEYS, KEY_NESTED, KEY_TOP, PLUS_ONE_KEYS
from specdiff.eagle3.families import FamilyRule, sglang_family_rule, vllm_family_note
from specdiff.eagle3.norms import NORM_FLAGS, SPECFORGE_NORM_OUTPUT
from specdiff.eagle3.vocab_map import read_d2t, t2d_from_d2t
from specdiff.replay.model.checkpoint import (
    IGNORED_KEYS,
    OPTIONAL_SHAPES,
    SPECFORGE_ARCH,
    SPECULATORS_ARCHS,
    canonical_name,
    expected_shapes,
)
from specdiff.replay.preflight.engines import (
    ENGINE_NAME,
    EngineCapture,
    fc_slots,
    fmt_hf,
    hf_label,
    read_config_ids,
)
from specdiff.replay.preflight.files import DraftInfo, TargetInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_aux", "check_vllm_ids", "check_family", "sglang_ids_fix", "check_training", "check_weights", "check_vocab", "check_norms", "check_rope",
           "check_algorithm", "check_tokenizer", "check_served_dtype", "check_tied", "sglang_context_length",
           "sglang_served_dtype"]


def slots_text(cap: EngineCapture, L: int) -> str:
    """The slots an engine feeds in plain words: HF indices with names, then a pre-norm one."""
    text = fmt_hf(cap.hf_indices, L)
    return text + (f" + pre-norm out L{L - 1}" if cap.prenorm_ids else "")


def _rule_text(fam: FamilyRule) -> str:
    """'the deepseek rule of DeepseekV3ForCausalLM (srt/models/deepseek_v2.py:3458-3473: ...)'."""
    return (f"the SGLang {fam.name} rule of {fam.architecture} ({fam.sources[0].split(' ')[0]}: "
            f"{fam.id_meaning()})")


def _sglang_rule_words(architecture: str | None) -> str:
    """How SGLang reads aux ids on this target: the Llama wording for the plus-one files (and no
    architecture), else the family's rule (``_rule_text``)."""
    fam = sglang_family_rule(architecture)
    if architecture is None or fam.name == "plus-one":
        return "SGLang id k captures HF k+1, -1 = embeddings"
    return _rule_text(fam)


def sglang_ids_fix(hf_indices, L: int, architecture: str | None) -> str:
    """The eagle_config ids that make SGLang feed ``hf_indices`` on this target, as a fix text
    (the Llama wording without an architecture); a list the rule cannot express says so."""
    try:
        ids = native_aux_ids(list(hf_indices), "sglang", num_layers=L, architecture=architecture)
    except ConventionError as e:
        return f"no SGLang ids give HF {list(hf_indices)}: {e}; retrain on other layers"
    if architecture is None:
        return f"set eagle_config.eagle_aux_hidden_state_layer_ids = {ids}"
    return (f"set eagle_config.eagle_aux_hidden_state_layer_ids = {ids} (SGLang reads them by "
            f"{_rule_text(sglang_family_rule(architecture))})")


def check_family(captures: dict[str, EngineCapture], architecture: str | None) -> list[Finding]:
    """Which SGLang rule reads the ids on this target (info), or that it was assumed (warn when
    the config names an architecture the table does not know); vLLM caveats for the family."""
    out: list[Finding] = []
    sg = captures.get("sglang")
    if sg is not None and sg.outcome != "unsupported":
        fam = sglang_family_rule(architecture)
        if fam.known:
            out.append(Finding("aux.family", "info", "sglang",
                               f"target {architecture}: SGLang 0.5.23 reads eagle_config ids by "
                               f"{_rule_text(fam)}" + (f"; {fam.note}" if fam.note else ""), ""))
        else:
            out.append(Finding("aux.family_assumed", "warn" if architecture else "info", "sglang", fam.note,
                               "check the target's model file in SGLang (set_eagle3_layers_to_capture) before "
                               "trusting the layers below"))
    note = vllm_family_note(architecture)
    if note and "vllm" in captures:
        out.append(Finding("aux.family", "info", "vllm", note, ""))
    return out


def _sglang_dropped(i: int, cap: EngineCapture, L: int, architecture: str | None) -> tuple[str, str]:
    """(why, fix) for an SGLang id that captures nothing, in the target's rule."""
    if architecture is None or cap.family == "plus-one" and not cap.failure:
        why = (f"maps to capture index {i + 1}, which is never reached (only layers 0..{L - 1} run)"
               if i >= L - 1 else f"maps to capture index {i + 1}, which no layer has")
        fix = ("the output of the last decoder layer cannot be captured by SGLang; use an earlier "
               "layer (id L-2 = HF L-1) and retrain, or drop the id and K" if i == L - 1 else
               f"use ids in -1..{L - 2} (id k = HF k+1; -1 = embeddings)")
        return why, fix
    fam = sglang_family_rule(architecture)
    c = dict(zip(cap.native_ids, fam.capture_indices(cap.native_ids, L)))[i]
    why = f"maps to capture index {c} under {_rule_text(fam)}, which no layer 0..{L - 1} has"
    return why, f"use ids that this rule maps to HF 0..{L - 1} ({fam.id_meaning()})"


def check_aux(captures: dict[str, EngineCapture], *, raw: dict, num_layers: int, aux_width: int,
              training_hf: tuple[int, ...] | None, architecture: str | None = None) -> list[Finding]:
    """Findings about the aux capture: the SGLang rule of the target's architecture, ignored
    keys, dropped ids, slot-count crashes, defaults, engines that disagree."""
    L = num_layers
    out: list[Finding] = check_family(captures, architecture)
    eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    e_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    t_ids = raw.get("eagle_aux_hidden_state_layer_ids")
    sg = captures.get("sglang")
    if sg is not None and sg.outcome == "unsupported":
        out.append(Finding("format.unsupported", "error", "sglang",
                           f"architectures {raw.get('architectures')} (speculators format): SGLang 0.5.23 "
                           f"has no model class for it, only {SPECFORGE_ARCH}",
                           "re-export in SpecForge format: load_draft(D) then save_draft(model, OUT, "
                           f"'specforge', target_num_layers={L})"))
    if sg is not None and sg.outcome != "unsupported" and e_ids is None and t_ids is not None:
        default = default_hf_indices(L)
        meanings = set()
        for conv in ("hf", "sglang"):
            try:
                meanings.add(resolve_aux_ids(t_ids, convention=conv, num_layers=L).hf_indices)
            except ConventionError:
                pass
        sev = "warn" if tuple(default) in meanings else "error"
        hf_like = sorted(set(int(i) for i in t_ids if isinstance(i, int) and 0 <= int(i) <= L - 1))
        fam = sglang_family_rule(architecture)
        try:
            want = native_aux_ids(hf_like, "sglang", architecture=architecture) \
                if all(isinstance(i, int) for i in t_ids) else t_ids
        except ConventionError:
            want = "(not expressible)"
        conv = "HF index - 1" if architecture is None else _rule_text(fam)
        out.append(Finding("aux.ignored_key", sev, "sglang",
                           f"eagle_aux_hidden_state_layer_ids {list(t_ids)} is only at the top level: SGLang "
                           f"ignores it and captures its default HF {fmt_hf(default, L)}",
                           f"put the ids in eagle_config.eagle_aux_hidden_state_layer_ids (SGLang convention: "
                           f"{conv}; e.g. HF indices {hf_like} -> {want})"))
    for eng, cap in captures.items():
        name = ENGINE_NAME[eng]
        if cap.outcome == "unsupported":
            continue
        for i in cap.dropped_ids:
            if eng == "sglang":
                why, fix = _sglang_dropped(i, cap, L, architecture)
            else:
                # vLLM 0.32.0 llama.py:427-441: capture points are ids 0 (embeddings) .. L (after layer L-1)
                why = (f"never matches a layer index (vLLM's ids are 0..{L}; id 0 is the embeddings)" if i < 0
                       else f"is past vLLM's last capture point, id {L} (after layer {L - 1})")
                fix = (f"write vLLM ids at the top level: id k = HF index k, 0..{L - 1}"
                       " (HF 0 = embeddings)")
            effect = (f"{name} loses that slot and then fails: {cap.failure}" if cap.failure
                      else f"{name} silently drops that slot")
            out.append(Finding("aux.dropped_id", "error", eng, f"{cap.source} id {i} {why}: {effect}", fix))
        got = cap.slots
        if cap.prenorm_ids and eng == "sglang":
            fam = sglang_family_rule(architecture)
            out.append(Finding("aux.prenorm_last", "warn", eng,
                               f"{cap.source} id {cap.prenorm_ids[0]} -> capture index {L} under {_rule_text(fam)}: "
                               f"{name} captures the output of the last decoder layer (layer {L - 1}) before the "
                               f"final norm ({fam.sources[-1].split(' ')[0]}); no HF hidden_states index holds it "
                               f"(HF {L} is after the final norm), so a draft trained on HF {L} gets another tensor",
                               "train on the state the engine feeds (the last layer's pre-norm output), or use "
                               f"ids this rule maps to HF 0..{L - 1} ({fam.id_meaning()})"))
        elif cap.prenorm_ids:
            out.append(Finding("aux.prenorm_last", "warn", eng,
                               f"{cap.source} id {cap.prenorm_ids[0]} = L: {name} captures the output of the last "
                               f"decoder layer (layer {L - 1}) before the final norm (vLLM 0.32.0 llama.py:438-441); "
                               f"no HF hidden_states index holds it (HF {L} is after the final norm), so a draft "
                               f"trained on HF {L} gets another tensor",
                               "train on the state vLLM feeds (speculators reads it from vLLM), or use ids "
                               f"0..{L - 1} (id k = HF index k)"))
        if cap.outcome == "crash" and cap.failure:
            out.append(Finding("aux.slot_count", "error", eng,
                               f"{name} captures {got} slot(s) HF {slots_text(cap, L)} of {cap.slots_expected}: "
                               f"{cap.failure}",
                               f"configure exactly {cap.slots_expected} distinct ids that "
                               + (_rule_text(sglang_family_rule(architecture)) if eng == "sglang" else name)
                               + f" maps to HF 0..{L - 1}"))
        elif cap.outcome == "crash":
            if eng == "sglang":
                msg = (f"{name} captures {got} slot(s) HF {slots_text(cap, L)} but fc expects "
                       f"{cap.slots_expected} x {aux_width}: the first request crashes with 'mat1 and mat2 "
                       f"shapes cannot be multiplied (Nx{got * aux_width} and "
                       f"{cap.slots_expected * aux_width}xHd)'")
            else:
                msg = (f"{name} captures {got} slot(s) HF {slots_text(cap, L)} but fc expects "
                       f"{cap.slots_expected} x {aux_width}: the first request crashes with \"shape "
                       f"'[-1, {cap.slots_expected * aux_width}]' is invalid for input of size ...\"")
            out.append(Finding("aux.slot_count", "error", eng, msg,
                               f"configure exactly {cap.slots_expected} distinct in-range ids for {name}"))
        elif cap.outcome == "fc-skipped":
            out.append(Finding("aux.slot_count", "error", eng,
                               f"{name} captures {got} slot(s) whose width {got * aux_width} equals the draft "
                               "hidden size: SGLang skips fc and feeds the raw target state (no error, "
                               "acceptance collapses)",
                               f"configure exactly {cap.slots_expected} distinct in-range ids"))
        if cap.source == "default":
            out.append(Finding("aux.default", "info", eng,
                               f"no aux ids for {name}: it captures its default HF {fmt_hf(cap.hf_indices, L)} "
                               "(= SpecForge's default training layers, ids [1, L//2-1, L-4])",
                               "" if training_hf is not None else
                               "if the draft was trained on other layers, write them into the config"))
        elif list(cap.native_ids) != sorted(cap.native_ids):
            out.append(Finding("aux.order", "info", eng,
                               f"ids {list(cap.native_ids)} are not ascending: {name} concatenates in layer "
                               f"order HF {list(cap.hf_indices)}",
                               "make sure training concatenated in ascending layer order too"))
    if e_ids and t_ids is not None and "sglang" in captures and "vllm" in captures \
            and captures["sglang"].outcome == "ok" and captures["vllm"].outcome == "ok" \
            and captures["sglang"].hf_indices != captures["vllm"].hf_indices:
        out.append(Finding("aux.conflicting_keys", "warn", "all",
                           f"eagle_config ids {list(e_ids)} (read by SGLang) and top-level ids {list(t_ids)} "
                           "(read by vLLM) name different layers",
                           "make both keys resolve to the training layers"))
    ok = {e: c for e, c in captures.items() if c.outcome == "ok"}
    if training_hf is None and len(ok) == 2 and ok["sglang"].hf_indices != ok["vllm"].hf_indices \
            and not any(f.kind == "aux.conflicting_keys" for f in out):
        out.append(Finding("aux.engines_disagree", "warn", "all",
                           f"SGLang captures HF {fmt_hf(ok['sglang'].hf_indices, L)} but vLLM captures HF "
                           f"{fmt_hf(ok['vllm'].hf_indices, L)} from the same config: the draft is right "
                           "for at most one of them",
                           "state the training layers with --training-layers; write SGLang ids in "
                           "eagle_config and vLLM ids (HF indices) at the top level"))
    return out


def _v_hf(ids, L: int, architecture: str | None) -> tuple[int, ...]:
    """HF indices vLLM captures for its ids (None: its default), HF ones only."""
    return engine_capture("vllm", ids, num_layers=L, architecture=architecture).hf_indices


def _runner_keys(read) -> str:
    keys = [k + (" (+1)" if k in PLUS_ONE_KEYS else "") for k in ENGINE_ID_KEYS[(read.engine, read.runner)]]
    return ", else ".join(keys)


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
    meant_hf = None  # what the ids mean when V1 misreads them (SGLang numbering)
    if v1.key == KEY_NESTED:
        try:
            sg = resolve_aux_ids(list(v1.ids), convention="sglang", num_layers=L, architecture=architecture)
        except ConventionError:
            sg = None
        if sg is not None and not sg.dropped and sg.hf_indices != cap.hf_indices:
            want = top_fix_ids if top_fix_ids is not None else list(sg.hf_indices)
            meant_hf = want
            neg = [i for i in v1.ids if i < 0]
            effect = (f"id {neg[0]} matches no layer, so {cap.slots} of {cap.slots_expected} slots reach fc and the "
                      "first request crashes" if neg and cap.outcome == "crash" else
                      f"vLLM feeds HF {slots_text(cap, L)}, SGLang HF {fmt_hf(sg.hf_indices, L)} from the same key")
            out.append(Finding("aux.sglang_ids", "error" if neg or cap.outcome == "crash" else "warn", "vllm",
                               f"eagle_config ids {list(v1.ids)} read in SGLang's numbering are HF "
                               f"{fmt_hf(sg.hf_indices, L)} ({_sglang_rule_words(architecture)}), but "
                               f"{v1.who} reads eagle_config's ids literally (id k = HF k): {effect}",
                               f"add top-level eagle_aux_hidden_state_layer_ids = {want} (vLLM id k = HF k; vLLM "
                               "reads it before eagle_config, SGLang ignores it)"))
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
    v2 = read_config_ids("vllm", raw, "v2")
    if v2.ids != v1.ids:
        try:
            hf2 = fmt_hf(_v_hf(v2.ids, L, architecture), L)
        except ConventionError:
            hf2 = f"ids {list(v2.ids or ())}"
        took = (f"reads {v2.key} {list(v2.ids)}: HF {hf2}" if v2.key else
                f"reads none of its keys ({_runner_keys(v2)}): {v2.fallback}, HF {hf2}")
        fix_ids = (top_fix_ids if top_fix_ids is not None else meant_hf if meant_hf is not None
                   else list(cap.hf_indices) if cap.outcome == "ok" and not cap.prenorm_ids else None)
        out.append(Finding("aux.runner_differs", "warn", "vllm",
                           f"on a GPU vLLM 0.32's default model runner V2 (config/vllm.py:722-738; {v2.sources}) "
                           f"{took}; V1 (the CPU build, or VLLM_USE_V2_MODEL_RUNNER=0) feeds HF {slots_text(cap, L)}"
                           + (f" from {v1.key}" if v1.key else ""),
                           "write the ids at top-level eagle_aux_hidden_state_layer_ids, which both runners read first"
                           + (f": {fix_ids} (vLLM id k = HF k)" if fix_ids else "")))
    k_cfg = fc_slots(raw)
    if k_cfg != k_weights:
        why = ("num_aux_hidden_states" if raw.get("num_aux_hidden_states") is not None else
               "the number of eagle_config ids" if (raw.get("eagle_config") or {}).get(
                   "eagle_aux_hidden_state_layer_ids") else "its default 3: no num_aux_hidden_states, no eagle_config ids")
        out.append(Finding("aux.fc_width", "error", "vllm",
                           f"vLLM builds fc for {k_cfg} aux slots ({why}; llama_eagle3.py:209-216 does not count the "
                           f"top-level ids) but fc.weight holds {k_weights}: loading the draft fails on fc's shape",
                           f"set num_aux_hidden_states = {k_weights} in the draft config"))
    return out


def _only(key: str, ids) -> dict:
    """A config dict holding only ``key`` = ``ids`` (what the ids in that key mean to a runner that reads it)."""
    parts = key.removeprefix("top-level ").split(".")
    d: dict = {parts[-1]: list(ids)}
    for p in reversed(parts[:-1]):
        d = {p: d}
    return d


def check_training(captures: dict[str, EngineCapture], training_hf: tuple[int, ...] | None, *,
                   num_layers: int, architecture: str | None = None) -> list[Finding]:
    """Per engine: do the layers it feeds equal the layers the draft was trained on? The SGLang
    fix is written in the target architecture's rule (``sglang_ids_fix``)."""
    if training_hf is None:
        return []
    L = num_layers
    out = []
    for eng, cap in captures.items():
        if cap.outcome == "unsupported":
            continue
        name = ENGINE_NAME[eng]
        if cap.hf_indices == training_hf and not cap.prenorm_ids:
            out.append(Finding("training.match", "info", eng,
                               f"{name} feeds HF {fmt_hf(cap.hf_indices, L)} = the training layers", ""))
            continue
        fed = [hf_label(i, L) for i in cap.hf_indices] + [f"pre-norm out L{L - 1}"] * bool(cap.prenorm_ids)
        pairs = ", ".join(f"slot {j}: trained on {hf_label(t, L)}, gets {s}"
                          for j, (t, s) in enumerate(zip(training_hf, fed)) if hf_label(t, L) != s)
        ascending = sorted(training_hf)
        reorder = (f"{name} always concatenates in ascending layer order, whatever the id order: retrain "
                   f"with the layers listed ascending, or reorder fc.weight's {len(training_hf)} column blocks "
                   f"from HF {list(training_hf)} to HF {ascending}")
        if ascending == list(cap.hf_indices) and not cap.prenorm_ids:
            out.append(Finding("training.aux_order", "error", eng,
                               f"{name} feeds the training layers in ascending order HF "
                               f"{fmt_hf(cap.hf_indices, L)} but training concatenated them as HF "
                               f"{fmt_hf(training_hf, L)} ({pairs}): fc multiplies each slot by the weights "
                               "trained for another layer", reorder))
            continue
        if eng == "sglang":
            if L in training_hf or any(i > L for i in training_hf):
                fix = "SGLang cannot capture the final-norm output (HF L): retrain on other layers"
            else:
                fix = sglang_ids_fix(ascending, L, architecture)
        else:
            if any(i >= L for i in training_hf):
                fix = "vLLM captures only HF 0..L-1: retrain on other layers"
            else:
                fix = f"set top-level eagle_aux_hidden_state_layer_ids = {ascending}"
        if list(training_hf) != ascending:
            fix += f"; also: {reorder}"
        out.append(Finding("training.mismatch", "error", eng,
                           f"{name} feeds HF {slots_text(cap, L)} but training used HF "
                           f"{fmt_hf(training_hf, L)}" + (f" ({pairs})" if pairs else ""), fix))
    return out


# ---- weights ----------------------------------------------------------------------------
def check_weights(draft: DraftInfo, target: TargetInfo, *, engines) -> list[Finding]:
    """Every expected key present with the right shape; missing / unexpected / ignored keys; dtype."""
    cfg = draft.config
    out: list[Finding] = []
    H, V = target.hidden_size, target.vocab_size
    th = cfg.target_hidden_size
    if th != H:
        out.append(Finding("weights.target_hidden", "error", "all",
                           f"draft config target_hidden_size {th} but the target's hidden_size is {H}",
                           f"set target_hidden_size = {H} (and retrain: fc was built for {th})"))
    if cfg.vocab_size != V:
        out.append(Finding("vocab.size", "error", "all",
                           f"draft config vocab_size {cfg.vocab_size} but the target's is {V} (t2d and "
                           "the shared embedding are [V])", f"set vocab_size = {V}"))
    cfg_t = dataclasses.replace(cfg, target_hidden_size=H, vocab_size=V)
    expected = expected_shapes(cfg_t)
    canon: dict[str, str] = {}
    unexpected, ignored = [], []
    for name in draft.tensors:
        if name in IGNORED_KEYS or name.endswith("rotary_emb.inv_freq"):
            ignored.append(name)
            continue
        c = canonical_name(name)
        if c not in expected and c not in OPTIONAL_SHAPES:
            unexpected.append(name)
        else:
            canon[c] = name
    lm_from_target = cfg.lm_head_from_target
    for k in expected:
        if k in canon:
            continue
        if k == "lm_head.weight" and lm_from_target:
            out.append(Finding("weights.lm_head_from_target", "info", "sglang",
                               "no lm_head.weight and no draft_vocab_size: SGLang loads the target's lm_head",
                               ""))
            continue
        out.append(Finding("weights.missing", "error", "all",
                           f"{k} {list(expected[k])} is missing: the engines leave that parameter "
                           "uninitialised (SGLang skips it silently)",
                           "re-export the checkpoint with every draft parameter"))
    for c, name in canon.items():
        shape = draft.tensors[name][0]
        want = expected[c] if c in expected else OPTIONAL_SHAPES[c](cfg_t)
        if tuple(shape) != tuple(want):
            if c == "fc.weight" and len(shape) == 2 and len(want) == 2 and shape[1] != want[1]:
                msg = (f"fc.weight is {list(shape)} but {cfg.num_aux} aux slots x target hidden {H} = "
                       f"{want[1]}: loading fails ('Attempted to load weight ... into parameter ...')")
            elif c.split(".")[-2:-1] in (["q_proj"], ["k_proj"], ["v_proj"]) and len(shape) == 2 \
                    and shape[1] != want[1]:
                msg = (f"{name} is {list(shape)} but attention input is 2 x draft hidden = {want[1]} "
                       f"(expected {list(want)})")
            elif c == "lm_head.weight":
                msg = f"lm_head.weight is {list(shape)} but [draft_vocab_size, hidden] = {list(want)}"
            elif c == "embed_tokens.weight" and "sglang" in engines and "vllm" not in engines:
                continue  # SGLang replaces it anyway (reported below)
            else:
                msg = f"{name} is {list(shape)} but the config implies {list(want)}"
            out.append(Finding("weights.shape", "error", "all", msg,
                               "fix the config dims or re-export the weights so they agree"))
    if unexpected:
        out.append(Finding("weights.unexpected", "warn", "all",
                           f"{len(unexpected)} key(s) match no draft parameter and are skipped silently: "
                           + ", ".join(sorted(unexpected)[:6]) + (" ..." if len(unexpected) > 6 else ""),
                           "check the flags (norm_before_fc, fc_norm) and names; trained weights may be unused"))
    if ignored:
        out.append(Finding("weights.ignored", "info", "all",
                           "ignored by the engines: " + ", ".join(sorted(ignored)), ""))
    has_embed = "embed_tokens.weight" in canon
    if has_embed and "sglang" in engines and cfg.target_hidden_size == cfg.hidden_size:
        # set_embed keeps the draft's own embedding only when the hidden sizes differ (llama.py:912-916)
        out.append(Finding("weights.ignored", "info", "sglang",
                           "embed_tokens.weight is in the checkpoint but SGLang 0.5.23 replaces it with the "
                           "target's embedding (speculative/eagle_worker_v2.py:363 -> set_embed, "
                           "srt/models/llama.py:917-918): a draft trained with its own embedding is served "
                           "with another one",
                           "train with the target's embedding frozen, or serve with vLLM"))
    if not has_embed and cfg.hidden_size != H:
        out.append(Finding("weights.embed", "error", "all",
                           f"no embed_tokens.weight: the engines share the target's embedding [{V}, {H}] "
                           f"but the draft hidden is {cfg.hidden_size}",
                           "ship embed_tokens.weight in the checkpoint"))
    # dtypes
    floats = {name: dt for name, (_, dt) in draft.tensors.items() if dt.startswith(("float", "bfloat"))}
    kinds = sorted(set(floats.values()))
    if len(kinds) > 1:
        by = {k: sorted(n for n, d in floats.items() if d == k) for k in kinds}
        out.append(Finding("weights.dtype", "warn", "all",
                           "mixed float dtypes: " + "; ".join(f"{k}: {len(v)} ({v[0]}...)" for k, v in by.items()),
                           "cast every float tensor to one dtype"))
    cdt = draft.raw.get("torch_dtype") or draft.raw.get("dtype")
    if isinstance(cdt, str) and len(kinds) == 1 and cdt != kinds[0]:
        out.append(Finding("weights.dtype", "info", "all",
                           f"config torch_dtype {cdt} but the weights are {kinds[0]} (engines use --dtype / "
                           "the target's dtype)", ""))
    for key in ("d2t", "t2d"):
        if key in canon:
            dt = draft.tensors[canon[key]][1]
            want = "int64" if key == "d2t" else "bool"
            if dt != want:
                sev = "error" if dt.startswith(("float", "bfloat")) else "warn"
                out.append(Finding("weights.dtype", sev, "all", f"{key} has dtype {dt}, expected {want}",
                                   f"store {key} as {want}"))
    return out


# ---- vocab map --------------------------------------------------------------------------
def check_vocab(d2t: torch.Tensor | None, t2d: torch.Tensor | None, *, draft_vocab_size: int,
                vocab_size: int, eos_token_ids=()) -> list[Finding]:
    """d2t present, in range, consistent with t2d; direct ids / arange; coverage
    (d2t read as offsets, ``specdiff.eagle3.vocab_map.read_d2t``)."""
    Vd, V = draft_vocab_size, vocab_size
    out: list[Finding] = []
    if d2t is None:
        if Vd < V:
            out.append(Finding("vocab.d2t_missing", "error", "all",
                               f"no d2t but the draft vocab ({Vd}) is smaller than the target's ({V}): draft id i "
                               f"is served as target id i, so only tokens 0..{Vd - 1} can be proposed",
                               "ship the d2t (offsets) written at training time"))
        else:
            out.append(Finding("vocab.identity", "info", "all",
                               f"no d2t and draft vocab = target vocab ({V}): identity mapping", ""))
        return out
    d2t = d2t.reshape(-1)
    if d2t.is_floating_point():
        return out  # reported by check_weights; values are meaningless
    d2t = d2t.to(torch.int64)
    if d2t.numel() != Vd:
        out.append(Finding("vocab.d2t_shape", "error", "all",
                           f"d2t has {d2t.numel()} entries but draft_vocab_size is {Vd}",
                           "d2t must have one offset per draft id"))
        return out
    r = read_d2t(d2t, t2d, vocab_size=V)
    if r.t2d_size is not None and r.t2d is None:
        out.append(Finding("vocab.t2d_shape", "warn", "all",
                           f"t2d has {r.t2d_size} entries but the target vocab is {V} (engines ignore t2d)", ""))
    mapped, t2d = r.mapped, r.t2d  # t2d: bool [V], None when absent or of the wrong length
    in_range, is_arange, direct_valid = r.in_range, r.is_arange, r.direct_valid
    offsets_match, direct_match, looks_direct = r.offsets_match, r.direct_match, r.looks_direct
    if looks_direct:
        ev = ("t2d marks exactly the ids d2t holds" if direct_match else
              f"read as offsets, draft id {int(torch.argmax(mapped))} maps to {int(mapped.max())} >= V={V}")
        out.append(Finding("vocab.d2t_direct", "error", "all",
                           f"d2t holds direct target ids, not offsets ({ev}); engines use d2t + arange, so "
                           f"draft id i is served as d2t[i] + i",
                           "store offsets: d2t = target_ids - arange(Vd)"))
        return out
    if direct_valid and t2d is None and Vd > 2 and in_range and not is_arange:
        out.append(Finding("vocab.d2t_direct", "warn", "all",
                           f"d2t is strictly increasing ({int(d2t[0])}, {int(d2t[1])}, {int(d2t[2])}, ...) and "
                           "there is no t2d to confirm: offsets of a sorted vocab usually repeat, so these "
                           "may be direct target ids", "ship t2d, or check that d2t = target_ids - arange(Vd)"))
    if not in_range:
        bad = r.out_of_range
        i = int(bad[0])
        out.append(Finding("vocab.d2t_range", "error", "all",
                           f"d2t + arange maps {bad.numel()} draft id(s) outside [0, {V}) (first: draft {i} -> "
                           f"{int(mapped[i])}): an out-of-range index on the first proposal",
                           "rebuild d2t from the training vocab map"))
        return out
    if is_arange and not offsets_match:
        out.append(Finding("vocab.d2t_arange", "warn", "all",
                           "d2t equals arange(Vd): as offsets it maps draft id i to 2i (a placeholder or "
                           "direct ids?)", "store offsets: d2t = target_ids - arange(Vd)"))
    if r.distinct != Vd:
        out.append(Finding("vocab.d2t_duplicate", "error", "all",
                           f"d2t + arange maps {Vd} draft ids onto only {r.distinct} target ids",
                           "rebuild d2t: each draft id must map to a distinct target id"))
    if t2d is not None and not offsets_match:
        marked = t2d_from_d2t(d2t, V)
        extra = torch.nonzero(marked & ~t2d).reshape(-1)
        unreached = torch.nonzero(t2d & ~marked).reshape(-1)
        parts = []
        if not bool(t2d.any()):
            parts.append("t2d marks no token at all (an unfilled placeholder?)")
        elif extra.numel():
            tid = int(extra[0])
            did = int(torch.nonzero(mapped == tid).reshape(-1)[0])
            parts.append(f"{extra.numel()} draft id(s) map to tokens t2d does not mark (first: draft {did} -> {tid})")
        if unreached.numel():
            parts.append(f"{unreached.numel()} token(s) t2d marks are reached by no draft id (first: {int(unreached[0])})")
        out.append(Finding("vocab.t2d_mismatch", "error", "all",
                           "d2t + arange disagrees with t2d: " + "; ".join(parts) + " (engines follow d2t only)",
                           "write d2t and t2d from the same vocab map (t2d[d2t + arange] = True, nothing else)"))
    # coverage
    pct = 100.0 * r.distinct / V
    out.append(Finding("vocab.coverage", "info", "all",
                       f"draft vocab covers {r.distinct} of {V} target tokens ({pct:.1f}%)", ""))
    miss_eos = [e for e in eos_token_ids if 0 <= e < V and not bool((mapped == e).any())]
    if miss_eos:
        out.append(Finding("vocab.eos", "warn", "all",
                           f"target eos id(s) {miss_eos} are not in the draft vocab: the draft can never "
                           "propose the end of a reply", "include the eos tokens when building the draft vocab"))
    return out


# ---- other contract points --------------------------------------------------------------
def check_norms(draft: DraftInfo, *, engines) -> list[Finding]:
    """norm_before_fc / fc_norm / norm_output / norm_before_residual and the weights they need."""
    cfg, raw = draft.config, draft.raw
    out: list[Finding] = []
    canon = {canonical_name(n) for n in draft.tensors}
    has_input_norm = "input_norm.weight" in canon
    has_fc_norm = any(c.startswith("fc_norm.") for c in canon)
    if has_input_norm and not cfg.norm_before_fc:
        out.append(Finding("norm.flag_missing", "error", "all",
                           "input_norm.weight is in the checkpoint but norm_before_fc is not set: the engines "
                           "skip the norm over the aux concat that training applied",
                           "set eagle_config.norm_before_fc = true (SGLang reads eagle_config first, then "
                           "the top level)"))
    if has_fc_norm and not cfg.fc_norm:
        out.append(Finding("norm.flag_missing", "error", "all",
                           "fc_norm.{j}.weight are in the checkpoint but fc_norm / use_aux_norm is not set: "
                           "the per-slot norms are skipped", "set fc_norm = true"))
    if cfg.norm_before_fc or cfg.fc_norm:
        flags = [n for n in ("norm_before_fc", "fc_norm") if getattr(cfg, n)]
        out.append(Finding("norm.flags", "info", "all",
                           "; ".join(f"{n} set: {NORM_FLAGS[n].meaning} ({NORM_FLAGS[n].sources['sglang']})"
                                     for n in flags), ""))
    if "norm_output" in raw or "norm_output" in (raw.get("eagle_config") or {}):
        out.append(Finding("norm.norm_output", "warn" if cfg.norm_output else "info", "sglang",
                           f"norm_output={cfg.norm_output}: in SGLang true means the next draft step gets the "
                           f"normed hidden; {SPECFORGE_NORM_OUTPUT}",
                           "check which hidden (pre- or post-norm) training fed back, and set the flag for SGLang"))
    if cfg.norm_before_residual and "sglang" in engines:
        out.append(Finding("norm.norm_before_residual", "error", "sglang",
                           "norm_before_residual=true (speculators): SGLang 0.5.23 does not implement it "
                           "(residual = raw hidden)", "serve with vLLM or retrain without it"))
    return out


def _scaling_key(s):
    return json.dumps(s, sort_keys=True) if s else None


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


def _draft_dims(draft: DraftInfo) -> dict:
    """The config dict holding the draft's Llama dims (speculators: transformer_layer_config)."""
    inner = draft.raw.get("transformer_layer_config")
    return inner if isinstance(inner, dict) else draft.raw


def check_rope(draft: DraftInfo, target: TargetInfo, *, context_length: int | None = None) -> list[Finding]:
    """Every rope key SGLang 0.5.23 reads for the draft (srt/models/llama.py:199-200, :324-336):
    rope_theta and rope_scaling against the target's, rope_is_neox_style, partial_rotary_factor, and
    the draft's context (max_position_embeddings) against the served one (``context_length``: the
    server's --context-length; None = what SGLang derives from the target's config)."""
    cfg = draft.config
    out = []
    if float(cfg.rope_theta) != float(target.rope_theta):
        out.append(Finding("rope.theta", "warn", "all",
                           f"draft rope_theta {cfg.rope_theta:g} but target rope_theta {target.rope_theta:g}: "
                           "the engines rotate draft positions with the draft's value",
                           f"set the draft rope_theta to what training used (usually the target's, "
                           f"{target.rope_theta:g})"))
    if _scaling_key(cfg.rope_scaling) != _scaling_key(target.rope_scaling):
        out.append(Finding("rope.scaling", "warn", "all",
                           f"draft rope_scaling {cfg.rope_scaling} but target rope_scaling {target.rope_scaling}",
                           "copy the target's rope_scaling into the draft config if training used it"))
    if not cfg.rope_is_neox_style:
        out.append(Finding("rope.style", "warn", "sglang",
                           "draft rope_is_neox_style false: SGLang 0.5.23 rotates the draft's q/k in interleaved "
                           "pairs (2i, 2i+1) (gptj style; llama.py:335, layers/rotary_embedding/utils.py:52-62) "
                           "instead of halves (neox, what Llama-style trainers such as SpecForge use)",
                           "remove rope_is_neox_style from the draft config (or set it true) unless the draft was "
                           "trained with interleaved rope"))
    if cfg.partial_rotary_factor != 1.0:
        out.append(Finding("rope.partial_rotary", "warn", "sglang",
                           f"draft partial_rotary_factor {cfg.partial_rotary_factor:g}: SGLang 0.5.23 rotates only "
                           f"the first {cfg.rotary_dim} of each head's {cfg.head_dim} dims (llama.py:199-200); the "
                           "other dims carry no position",
                           "remove partial_rotary_factor from the draft config unless training rotated the same "
                           "dims (record train replays the config as SGLang serves it)"))
    served = context_length or sglang_context_length(target.config.get("text_config") or target.config)
    own = sglang_context_length(_draft_dims(draft))
    if own < served:
        out.append(Finding("rope.max_positions", "error", "sglang",
                           f"draft max_position_embeddings {cfg.max_position_embeddings} (context {own}) < the "
                           f"served context {served}: SGLang 0.5.23 refuses to start (ValueError: \"Target model's "
                           "context_length ... is greater than the derived context_length\", "
                           "srt/configs/model_config.py:1314; the draft gets the target's context, "
                           "speculative/eagle_worker_v2.py:229) unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, "
                           "which overrides the draft's max_position_embeddings to the target's "
                           "(model_config.py:1303-1311)",
                           f"set max_position_embeddings = {served} in the draft config (rope does not depend on "
                           "it), or start the server with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"))
        out.append(Finding("rope.max_positions", "warn", "vllm",
                           f"draft max_position_embeddings {cfg.max_position_embeddings} < the served context "
                           f"{served}: positions past it are beyond what the draft config declares",
                           f"set max_position_embeddings = {served} in the draft config"))
    return out


def check_served_dtype(draft: DraftInfo, *, dtype: str = "auto") -> list[Finding]:
    """The dtype SGLang 0.5.23 serves the draft in (``sglang_served_dtype`` of the draft's config for
    ``--dtype dtype``) against the dtype its weights were trained / stored in (safetensors headers):
    float16 for a bfloat16 draft is a warning (float16 overflows past 65504 where bf16 does not);
    float16 for float32 weights (trained dtype unknown) is said as info."""
    served = sglang_served_dtype(draft.raw, dtype)
    floats = sorted({dt for n, (_, dt) in draft.tensors.items()
                     if dt.startswith(("float", "bfloat")) and canonical_name(n) not in ("d2t", "t2d")})
    if served != "float16" or not floats or floats == ["float16"]:
        return []
    how = (f"--dtype {dtype}" if dtype != "auto" else
           f"--dtype auto with config dtype {draft.raw.get('dtype') or draft.raw.get('torch_dtype') or 'absent'} "
           "(float32 or absent becomes float16: srt/configs/model_config.py:2303-2319)")
    fix = "serve in bfloat16: --dtype bfloat16"
    if "bfloat16" in floats:
        return [Finding("weights.served_dtype", "warn", "sglang",
                        f"the draft's weights are bfloat16 but SGLang 0.5.23 serves it in float16 ({how}): "
                        "activations past float16's 65504 overflow to inf/NaN, and weights below 2**-14 lose "
                        "precision", fix)]
    return [Finding("weights.served_dtype", "info", "sglang",
                    f"SGLang 0.5.23 serves this draft in float16 ({how}) while its weights are {floats[0]}: a draft "
                    "trained in bfloat16 can overflow there (float16's largest value is 65504)", fix)]


def check_tied(draft: DraftInfo, target: TargetInfo) -> list[Finding]:
    """``tie_word_embeddings: true``: what SGLang 0.5.23 scores the draft with (a finding, not a refusal)."""
    cfg = draft.config
    if not cfg.tie_word_embeddings:
        return []
    shared = cfg.target_hidden_size == cfg.hidden_size == target.hidden_size
    head = ("the target's embedding (set_embed replaces the draft's, srt/models/llama.py:917-918)" if shared
            else "the draft's own embed_tokens (set_embed keeps it when the hidden sizes differ, llama.py:912-916)")
    return [Finding("weights.tied_lm_head", "warn", "sglang",
                    "tie_word_embeddings is true: SGLang 0.5.23 makes the draft's lm_head its embed_tokens "
                    f"(srt/models/llama_eagle3.py:303-304), so the draft scores with {head}, its first "
                    f"{cfg.draft_vocab_size} rows; a trained lm_head.weight is not used",
                    "set tie_word_embeddings to false in the draft config and ship the trained lm_head.weight")]


def _normalize_algorithm(a: str) -> str:
    return a.upper().replace("-", "").replace("_", "")


def check_algorithm(draft: DraftInfo, algorithm: str | None, *, target_hidden: int) -> list[Finding]:
    """--speculative-algorithm vs the checkpoint kind."""
    archs = draft.raw.get("architectures") or []
    if draft.format is None:
        return [Finding("algorithm.not_eagle3", "error", "all",
                        f"draft architectures {archs} is not an EAGLE-3 checkpoint (expected {SPECFORGE_ARCH} "
                        f"or {list(SPECULATORS_ARCHS)})",
                        "use an EAGLE-3 draft, or the speculative algorithm this draft was trained for")]
    if algorithm is None:
        return []
    a = _normalize_algorithm(algorithm)
    if a == "EAGLE3":
        return []
    if a == "EAGLE":
        hd = draft.config.hidden_size
        what = ("fc is skipped because the width equals the draft hidden" if target_hidden == hd
                else "fc gets a width it was not built for")
        return [Finding("algorithm.mismatch", "error", "sglang",
                        f"--speculative-algorithm EAGLE with an EAGLE-3 checkpoint ({archs}): no aux layers are "
                        f"captured, the last hidden [{target_hidden}] arrives, {what}, and lm_head is replaced "
                        "by the target's", "serve with --speculative-algorithm EAGLE3")]
    return [Finding("algorithm.mismatch", "error", "all",
                    f"--speculative-algorithm {algorithm} with an EAGLE-3 checkpoint ({archs})",
                    "serve with --speculative-algorithm EAGLE3")]


def check_tokenizer(draft: DraftInfo, target: TargetInfo) -> list[Finding]:
    """Tokenizer / chat template of the draft directory vs the target's, when both are present."""
    out = []
    if draft.tokenizer_sha256 and target.tokenizer_sha256 and draft.tokenizer_sha256 != target.tokenizer_sha256:
        out.append(Finding("tokenizer.mismatch", "warn", "all",
                           f"draft tokenizer.json sha256 {draft.tokenizer_sha256[:12]} != target "
                           f"{target.tokenizer_sha256[:12]}: training data may have used another tokenizer",
                           "train the draft on data tokenized with the target's tokenizer"))
    if draft.chat_template_sha256 and target.chat_template_sha256 \
            and draft.chat_template_sha256 != target.chat_template_sha256:
        out.append(Finding("tokenizer.chat_template", "warn", "all",
                           f"draft chat template sha256 {draft.chat_template_sha256[:12]} != target "
                           f"{target.chat_template_sha256[:12]}: training prompts were formatted differently "
                           "from serving", "regenerate the training data with the target's chat template"))
    return out


