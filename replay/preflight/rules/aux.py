"""The aux-capture rules: which SGLang rule reads the ids on this target, what each engine captures
from the draft config (ignored keys, dropped ids, the pre-norm slot, slot-count crashes, defaults,
engines that disagree), and whether that equals the layers the draft was trained on. Pure
functions of what ``files`` read and ``engines`` resolved; the id rules come from
``specdiff.eagle3.aux_layers``.
"""

from __future__ import annotations

from specdiff.eagle3.aux_layers import ConventionError, default_hf_indices, native_aux_ids, resolve_aux_ids
from specdiff.eagle3.families import sglang_family_rule, vllm_family_note
from specdiff.replay.model.draft_config import SPECFORGE_ARCH
from specdiff.replay.preflight.engines import ENGINE_NAME, EngineCapture, fmt_hf, hf_label
from specdiff.replay.preflight.report import Finding
from specdiff.replay.preflight.rules.wording import rule_text, sglang_ids_fix, slots_text

__all__ = ["check_family", "check_aux", "check_training"]


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
                               f"{rule_text(fam)}" + (f"; {fam.note}" if fam.note else ""), ""))
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
    why = f"maps to capture index {c} under {rule_text(fam)}, which no layer 0..{L - 1} has"
    return why, f"use ids that this rule maps to HF 0..{L - 1} ({fam.id_meaning()})"


def _sglang_reads(sg: EngineCapture | None, *, raw: dict, e_ids, t_ids, L: int,
                  architecture: str | None) -> list[Finding]:
    """SGLang and the config as a whole: a format it has no model class for, or ids only at the
    top level, which it never reads."""
    out: list[Finding] = []
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
        conv = "HF index - 1" if architecture is None else rule_text(fam)
        out.append(Finding("aux.ignored_key", sev, "sglang",
                           f"eagle_aux_hidden_state_layer_ids {list(t_ids)} is only at the top level: SGLang "
                           f"ignores it and captures its default HF {fmt_hf(default, L)}",
                           f"put the ids in eagle_config.eagle_aux_hidden_state_layer_ids (SGLang convention: "
                           f"{conv}; e.g. HF indices {hf_like} -> {want})"))
    return out


def _dropped_ids(eng: str, cap: EngineCapture, *, L: int, architecture: str | None) -> list[Finding]:
    """One error per id the engine captures nothing for, with what the engine then does."""
    name = ENGINE_NAME[eng]
    out: list[Finding] = []
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
    return out


def _prenorm_slot(eng: str, cap: EngineCapture, *, L: int, architecture: str | None) -> list[Finding]:
    """The id that captures the last layer's output before the final norm, which no HF index holds."""
    name = ENGINE_NAME[eng]
    if cap.prenorm_ids and eng == "sglang":
        fam = sglang_family_rule(architecture)
        return [Finding("aux.prenorm_last", "warn", eng,
                        f"{cap.source} id {cap.prenorm_ids[0]} -> capture index {L} under {rule_text(fam)}: "
                        f"{name} captures the output of the last decoder layer (layer {L - 1}) before the "
                        f"final norm ({fam.sources[-1].split(' ')[0]}); no HF hidden_states index holds it "
                        f"(HF {L} is after the final norm), so a draft trained on HF {L} gets another tensor",
                        "train on the state the engine feeds (the last layer's pre-norm output), or use "
                        f"ids this rule maps to HF 0..{L - 1} ({fam.id_meaning()})")]
    if cap.prenorm_ids:
        return [Finding("aux.prenorm_last", "warn", eng,
                        f"{cap.source} id {cap.prenorm_ids[0]} = L: {name} captures the output of the last "
                        f"decoder layer (layer {L - 1}) before the final norm (vLLM 0.32.0 llama.py:438-441); "
                        f"no HF hidden_states index holds it (HF {L} is after the final norm), so a draft "
                        f"trained on HF {L} gets another tensor",
                        "train on the state vLLM feeds (speculators reads it from vLLM), or use ids "
                        f"0..{L - 1} (id k = HF index k)")]
    return []


def _slot_count(eng: str, cap: EngineCapture, *, L: int, aux_width: int,
                architecture: str | None) -> list[Finding]:
    """Slots that reach fc against the K it was built for: the crash, or SGLang skipping fc."""
    name, got = ENGINE_NAME[eng], cap.slots
    if cap.outcome == "crash" and cap.failure:
        return [Finding("aux.slot_count", "error", eng,
                        f"{name} captures {got} slot(s) HF {slots_text(cap, L)} of {cap.slots_expected}: "
                        f"{cap.failure}",
                        f"configure exactly {cap.slots_expected} distinct ids that "
                        + (rule_text(sglang_family_rule(architecture)) if eng == "sglang" else name)
                        + f" maps to HF 0..{L - 1}")]
    if cap.outcome == "crash":
        if eng == "sglang":
            msg = (f"{name} captures {got} slot(s) HF {slots_text(cap, L)} but fc expects "
                   f"{cap.slots_expected} x {aux_width}: the first request crashes with 'mat1 and mat2 "
                   f"shapes cannot be multiplied (Nx{got * aux_width} and "
                   f"{cap.slots_expected * aux_width}xHd)'")
        else:
            msg = (f"{name} captures {got} slot(s) HF {slots_text(cap, L)} but fc expects "
                   f"{cap.slots_expected} x {aux_width}: the first request crashes with \"shape "
                   f"'[-1, {cap.slots_expected * aux_width}]' is invalid for input of size ...\"")
        return [Finding("aux.slot_count", "error", eng, msg,
                        f"configure exactly {cap.slots_expected} distinct in-range ids for {name}")]
    if cap.outcome == "fc-skipped":
        return [Finding("aux.slot_count", "error", eng,
                        f"{name} captures {got} slot(s) whose width {got * aux_width} equals the draft "
                        "hidden size: SGLang skips fc and feeds the raw target state (no error, "
                        "acceptance collapses)",
                        f"configure exactly {cap.slots_expected} distinct in-range ids")]
    return []


def _default_or_order(eng: str, cap: EngineCapture, *, L: int,
                      training_hf: tuple[int, ...] | None) -> list[Finding]:
    """No ids (the engine's default layers), or ids not ascending (the engine concatenates ascending)."""
    name = ENGINE_NAME[eng]
    if cap.source == "default":
        return [Finding("aux.default", "info", eng,
                        f"no aux ids for {name}: it captures its default HF {fmt_hf(cap.hf_indices, L)} "
                        "(= SpecForge's default training layers, ids [1, L//2-1, L-4])",
                        "" if training_hf is not None else
                        "if the draft was trained on other layers, write them into the config")]
    if list(cap.native_ids) != sorted(cap.native_ids):
        return [Finding("aux.order", "info", eng,
                        f"ids {list(cap.native_ids)} are not ascending: {name} concatenates in layer "
                        f"order HF {list(cap.hf_indices)}",
                        "make sure training concatenated in ascending layer order too")]
    return []


def _across_engines(captures: dict[str, EngineCapture], *, e_ids, t_ids, L: int,
                    training_hf: tuple[int, ...] | None) -> list[Finding]:
    """SGLang and vLLM fed other layers from the same config: two keys that disagree, or (with no
    training layers to judge by) two engines that do."""
    out: list[Finding] = []
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


def check_aux(captures: dict[str, EngineCapture], *, raw: dict, num_layers: int, aux_width: int,
              training_hf: tuple[int, ...] | None, architecture: str | None = None) -> list[Finding]:
    """Findings about the aux capture: the SGLang rule of the target's architecture, ignored
    keys, dropped ids, slot-count crashes, defaults, engines that disagree."""
    L = num_layers
    out: list[Finding] = check_family(captures, architecture)
    eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    e_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    t_ids = raw.get("eagle_aux_hidden_state_layer_ids")
    out += _sglang_reads(captures.get("sglang"), raw=raw, e_ids=e_ids, t_ids=t_ids, L=L, architecture=architecture)
    for eng, cap in captures.items():
        if cap.outcome == "unsupported":
            continue
        out += _dropped_ids(eng, cap, L=L, architecture=architecture)
        out += _prenorm_slot(eng, cap, L=L, architecture=architecture)
        out += _slot_count(eng, cap, L=L, aux_width=aux_width, architecture=architecture)
        out += _default_or_order(eng, cap, L=L, training_hf=training_hf)
    out += _across_engines(captures, e_ids=e_ids, t_ids=t_ids, L=L, training_hf=training_hf)
    return out


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
