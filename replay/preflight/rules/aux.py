"""The aux-capture rules: which target-architecture rule reads the ids for an engine whose ids the target's
rule reads (``EngineSpec.aux_family_rules``), what each engine captures from the draft config (ignored keys,
dropped ids, the pre-norm slot, slot-count crashes, defaults, engines that disagree), and whether that equals
the layers the draft was trained on. Pure functions of what ``files`` read and ``engines`` resolved; the id
rules come from ``specdiff.eagle3.aux_layers``; each finding names its engine from the ``EngineSpec``.
"""

from __future__ import annotations

from specdiff.eagle3.aux_layers import ConventionError, default_hf_indices, native_aux_ids, resolve_aux_ids
from specdiff.eagle3.config_keys import KEY_NESTED, KEY_TOP
from specdiff.eagle3.engines import REGISTRY, EngineSpec
from specdiff.eagle3.families import sglang_family_rule
from specdiff.replay.model.draft_config import SPECFORGE_ARCH
from specdiff.replay.preflight.engines import ENGINE_NAME, EngineCapture, checked_specs, fmt_hf, hf_label
from specdiff.replay.preflight.report import Finding
from specdiff.replay.preflight.rules.wording import rule_text, sglang_ids_fix, slots_text

__all__ = ["check_family", "check_aux", "check_training"]


def check_family(captures: dict[str, EngineCapture], architecture: str | None) -> list[Finding]:
    """Per engine captured, in the registry's order: for one whose ids the target's rule reads
    (``EngineSpec.aux_family_rules``) which rule that is (info), or that it was assumed (warn when the
    config names an architecture the table does not know); for the others, the caveats their capture
    notes for the family (``EngineCapture.notes``, e.g. ``vllm_family_note``)."""
    out: list[Finding] = []
    for spec in checked_specs(REGISTRY):
        cap = captures.get(spec.name)
        if cap is None:
            continue
        if not spec.aux_family_rules:
            out += [Finding("aux.family", "info", spec.name, note, "") for note in cap.notes]
            continue
        if cap.outcome == "unsupported":
            continue
        fam = sglang_family_rule(architecture)
        if fam.known:
            out.append(Finding("aux.family", "info", spec.name,
                               f"target {architecture}: {spec.label} reads eagle_config ids by "
                               f"{rule_text(fam)}" + (f"; {fam.note}" if fam.note else ""), ""))
        else:
            out.append(Finding("aux.family_assumed", "warn" if architecture else "info", spec.name, fam.note,
                               f"check the target's model file in {spec.title} (set_eagle3_layers_to_capture) "
                               "before trusting the layers below"))
    return out


def _family_dropped(name: str, i: int, cap: EngineCapture, L: int, architecture: str | None) -> tuple[str, str]:
    """(why, fix) for an id that captures nothing on engine ``name`` (its title), whose ids the target's rule
    reads (``EngineSpec.aux_family_rules``), in that rule."""
    if architecture is None or cap.family == "plus-one" and not cap.failure:
        why = (f"maps to capture index {i + 1}, which is never reached (only layers 0..{L - 1} run)"
               if i >= L - 1 else f"maps to capture index {i + 1}, which no layer has")
        fix = (f"the output of the last decoder layer cannot be captured by {name}; use an earlier "
               "layer (id L-2 = HF L-1) and retrain, or drop the id and K" if i == L - 1 else
               f"use ids in -1..{L - 2} (id k = HF k+1; -1 = embeddings)")
        return why, fix
    fam = sglang_family_rule(architecture)
    c = dict(zip(cap.native_ids, fam.capture_indices(cap.native_ids, L)))[i]
    why = f"maps to capture index {c} under {rule_text(fam)}, which no layer 0..{L - 1} has"
    return why, f"use ids that this rule maps to HF 0..{L - 1} ({fam.id_meaning()})"


def _unread_config(spec: EngineSpec, cap: EngineCapture, *, raw: dict, e_ids, t_ids, L: int,
                   architecture: str | None) -> list[Finding]:
    """One engine and the config as a whole: a format it has no model class for (``EngineSpec.checkpoint_formats``),
    or ids only at the top level where it reads ``eagle_config``'s only (``EngineSpec.aux_ids_read``)."""
    out: list[Finding] = []
    if cap.outcome == "unsupported":
        out.append(Finding("format.unsupported", "error", spec.name,
                           f"architectures {raw.get('architectures')} (speculators format): {spec.label} "
                           f"has no model class for it, only {SPECFORGE_ARCH}",
                           "re-export in SpecForge format: load_draft(D) then save_draft(model, OUT, "
                           f"'specforge', target_num_layers={L})"))
    elif spec.aux_ids_read == (KEY_NESTED,) and e_ids is None and t_ids is not None:
        default = default_hf_indices(L)
        meanings = set()
        for conv in ("hf", spec.aux_convention):
            try:
                meanings.add(resolve_aux_ids(t_ids, convention=conv, num_layers=L).hf_indices)
            except ConventionError:
                pass
        sev = "warn" if tuple(default) in meanings else "error"
        hf_like = sorted(set(int(i) for i in t_ids if isinstance(i, int) and 0 <= int(i) <= L - 1))
        fam = sglang_family_rule(architecture)
        try:
            want = native_aux_ids(hf_like, spec.aux_convention, architecture=architecture) \
                if all(isinstance(i, int) for i in t_ids) else t_ids
        except ConventionError:
            want = "(not expressible)"
        conv = "HF index - 1" if architecture is None else rule_text(fam)
        out.append(Finding("aux.ignored_key", sev, spec.name,
                           f"eagle_aux_hidden_state_layer_ids {list(t_ids)} is only at the top level: {spec.title} "
                           f"ignores it and captures its default HF {fmt_hf(default, L)}",
                           f"put the ids in {KEY_NESTED} ({spec.title} convention: "
                           f"{conv}; e.g. HF indices {hf_like} -> {want})"))
    return out


def _dropped_ids(eng: str, cap: EngineCapture, *, L: int, architecture: str | None) -> list[Finding]:
    """One error per id the engine captures nothing for, with what the engine then does."""
    name = ENGINE_NAME[eng]
    out: list[Finding] = []
    for i in cap.dropped_ids:
        if REGISTRY[eng].aux_family_rules:
            why, fix = _family_dropped(name, i, cap, L, architecture)
        else:
            # one numbering for every target, id k = HF k: capture points are ids 0 (embeddings) .. L (after
            # layer L-1; vLLM 0.32.0 model_executor/models/llama.py:427-441)
            why = (f"never matches a layer index ({name}'s ids are 0..{L}; id 0 is the embeddings)" if i < 0
                   else f"is past {name}'s last capture point, id {L} (after layer {L - 1})")
            fix = (f"write {name} ids at the top level: id k = HF index k, 0..{L - 1}"
                   " (HF 0 = embeddings)")
        effect = (f"{name} loses that slot and then fails: {cap.failure}" if cap.failure
                  else f"{name} silently drops that slot")
        out.append(Finding("aux.dropped_id", "error", eng, f"{cap.source} id {i} {why}: {effect}", fix))
    return out


def _prenorm_slot(eng: str, cap: EngineCapture, *, L: int, architecture: str | None) -> list[Finding]:
    """The id that captures the last layer's output before the final norm, which no HF index holds."""
    name = ENGINE_NAME[eng]
    if cap.prenorm_ids and REGISTRY[eng].aux_family_rules:
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
                        f"decoder layer (layer {L - 1}) before the final norm ({REGISTRY[eng].label} "
                        f"{REGISTRY[eng].prenorm_capture_site}); no HF hidden_states index holds it (HF {L} is after "
                        f"the final norm), so a draft trained on HF {L} gets another tensor",
                        # speculators trains on hidden states it reads from vLLM, whichever engine serves the draft
                        f"train on the state {name} feeds (speculators reads it from vLLM), or use ids "
                        f"0..{L - 1} (id k = HF index k)")]
    return []


def _slot_count(eng: str, cap: EngineCapture, *, L: int, aux_width: int,
                architecture: str | None) -> list[Finding]:
    """Slots that reach fc against the K it was built for: the crash (in the engine's words,
    ``EngineSpec.slot_crash``), or the engine skipping fc."""
    spec, name, got = REGISTRY[eng], ENGINE_NAME[eng], cap.slots
    if cap.outcome == "crash" and cap.failure:
        return [Finding("aux.slot_count", "error", eng,
                        f"{name} captures {got} slot(s) HF {slots_text(cap, L)} of {cap.slots_expected}: "
                        f"{cap.failure}",
                        f"configure exactly {cap.slots_expected} distinct ids that "
                        + (rule_text(sglang_family_rule(architecture)) if spec.aux_family_rules else name)
                        + f" maps to HF 0..{L - 1}")]
    if cap.outcome == "crash":
        crash = spec.slot_crash.format(got=got * aux_width, want=cap.slots_expected * aux_width)
        msg = (f"{name} captures {got} slot(s) HF {slots_text(cap, L)} but fc expects "
               f"{cap.slots_expected} x {aux_width}: the first request crashes with {crash}")
        return [Finding("aux.slot_count", "error", eng, msg,
                        f"configure exactly {cap.slots_expected} distinct in-range ids for {name}")]
    if cap.outcome == "fc-skipped":
        return [Finding("aux.slot_count", "error", eng,
                        f"{name} captures {got} slot(s) whose width {got * aux_width} equals the draft "
                        f"hidden size: {name} skips fc and feeds the raw target state (no error, "
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
    """The engine reading eagle_config's ids and the one reading the top-level ids
    (``EngineSpec.aux_ids_key``: SGLang, vLLM) fed other layers from the same config: two keys
    that disagree, or (with no training layers to judge by) two engines that do."""
    out: list[Finding] = []
    ok = {e: c for e, c in captures.items() if c.outcome == "ok"}
    by_key = {s.aux_ids_key: s for s in checked_specs(ok)}
    nested, top = by_key.get(KEY_NESTED), by_key.get(KEY_TOP)
    if nested is None or top is None or ok[nested.name].hf_indices == ok[top.name].hf_indices:
        return out
    if e_ids and t_ids is not None:
        out.append(Finding("aux.conflicting_keys", "warn", "all",
                           f"eagle_config ids {list(e_ids)} (read by {nested.title}) and top-level ids {list(t_ids)} "
                           f"(read by {top.title}) name different layers",
                           "make both keys resolve to the training layers"))
    elif training_hf is None:
        out.append(Finding("aux.engines_disagree", "warn", "all",
                           f"{nested.title} captures HF {fmt_hf(ok[nested.name].hf_indices, L)} but {top.title} "
                           f"captures HF {fmt_hf(ok[top.name].hf_indices, L)} from the same config: the draft is "
                           "right for at most one of them",
                           f"state the training layers with --training-layers; write {nested.title} ids in "
                           f"eagle_config and {top.title} ids (HF indices) at the top level"))
    return out


def check_aux(captures: dict[str, EngineCapture], *, raw: dict, num_layers: int, aux_width: int,
              training_hf: tuple[int, ...] | None, architecture: str | None = None) -> list[Finding]:
    """Findings about the aux capture: the target architecture's rule for an engine that reads ids by it,
    formats and keys an engine does not read, dropped ids, slot-count crashes, defaults, engines that
    disagree."""
    L = num_layers
    out: list[Finding] = check_family(captures, architecture)
    eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    e_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    t_ids = raw.get("eagle_aux_hidden_state_layer_ids")
    for spec in checked_specs(captures):
        out += _unread_config(spec, captures[spec.name], raw=raw, e_ids=e_ids, t_ids=t_ids, L=L,
                              architecture=architecture)
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
    """Per engine: do the layers it feeds equal the layers the draft was trained on? For an engine whose
    ids the target's rule reads (``EngineSpec.aux_family_rules``) the fix is written in that rule
    (``sglang_ids_fix``); for the others, in the key it reads (``EngineSpec.aux_ids_key``)."""
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
        spec = REGISTRY[eng]
        if spec.aux_family_rules:
            if L in training_hf or any(i > L for i in training_hf):
                fix = f"{name} cannot capture the final-norm output (HF L): retrain on other layers"
            else:
                fix = sglang_ids_fix(ascending, L, architecture)
        else:
            if any(i >= L for i in training_hf):
                fix = f"{name} captures only HF 0..L-1: retrain on other layers"
            else:
                fix = f"set {spec.aux_ids_key} = {ascending}"
        if list(training_hf) != ascending:
            fix += f"; also: {reorder}"
        out.append(Finding("training.mismatch", "error", eng,
                           f"{name} feeds HF {slots_text(cap, L)} but training used HF "
                           f"{fmt_hf(training_hf, L)}" + (f" ({pairs})" if pairs else ""), fix))
    return out
