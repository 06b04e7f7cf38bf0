"""Every recorded fact compared key by key: nothing is dropped because nobody listed it.

check.py compares the contract fields it words one by one (facts.py ``WORDED``: the rows with a severity)
and calls this module for every other fact both sides recorded, the dict facts read whole from the live objects flattened to
dotted keys (``draft_config.rope_parameters.rope_theta``; tracer/config_facts.py,
tracer/weight_facts.py), and turns each difference into a ``ContractMismatch``:

- a key the fact table knows (replay/diff/contract/facts.py ``fact_row``) is a warning with its first stage and
  its fix;
- any other key is still a warning: ``unlisted difference: KEY: training X, serving Y; stage unknown``;
- keys never compared are the ones ``facts.not_compared`` names (provenance, recorder bookkeeping,
  options that do not change the computation);
- the engine's options: between two traces of one engine, every resolved field; between a serving trace
  and a trace of another engine or of training, the options the operator gave (``engine_options_given``)
  against the engine's defaults (what the reference computes, as a correct pair's engine does);
- weights: per checkpoint tensor (draft) and per layer (target), by checkpoint name; a parameter the
  engine built that its checkpoint did not provide (``*_unloaded``) is a warning on its own, per unit;
- module structures are each engine's own names: compared between traces of one engine only.

A fact one side did not record (an older trace) is not compared; when the other side has it, one info
line per side says so. Keys only one side's dict holds are listed once, as info.
"""

from __future__ import annotations

from dataclasses import replace

from specdiff.eagle3.engines import UnknownEngineError, engine_spec
from specdiff.replay.diff.contract.facts import canonical_value, fact_row
from specdiff.replay.diff.contract.not_compared import not_compared
from specdiff.replay.diff.types import ContractMismatch, Pair, side_names
from specdiff.replay.model.weight_files import canonical_name
from specdiff.tracer.contract import UNKNOWN, known
from specdiff.tracer.contract_fields import CONTRACT_FIELDS
from specdiff.tracer.schema import STAGE_ORDER

#: facts read whole from the live objects (tracer/contract.py), compared leaf by leaf
DICT_FACTS = ("draft_config", "target_config", "engine_options")
#: fingerprint dicts compared key by key (draft_layer_input_norms: the norm each later draft layer reads)
WEIGHT_FACTS = ("draft_weights", "target_weights", "draft_layer_input_norms")
UNLOADED_FACTS = ("draft_unloaded", "target_unloaded")
STRUCTURE_FACTS = ("draft_structure", "target_structure")
#: state no checkpoint holds, read off the live models after load (tracer/state_facts.py), compared key by key:
#: each layer's rope table (comparable across engines and training) and every buffer by the engine's own
#: module path (between traces of one engine only)
STATE_FACTS = ("target_rope", "draft_rope")
BUFFER_FACTS = ("target_buffers", "draft_buffers")
#: config key -> {value, source}: what an engine option set; a key one side lacks is no override there
OVERRIDE_FACTS = ("target_config_overrides", "draft_config_overrides")
NEW_FACTS = DICT_FACTS + WEIGHT_FACTS + UNLOADED_FACTS + STRUCTURE_FACTS + STATE_FACTS + BUFFER_FACTS + OVERRIDE_FACTS
#: how much of a value a message shows
SHOWN = 60


def flatten(value, prefix: str) -> dict:
    """``{dotted key: leaf}`` of a nested dict (a list is a leaf)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out = {}
    for k, v in value.items():
        out.update(flatten(v, f"{prefix}.{k}"))
    return out


def shown(key: str, v) -> str:
    """A value as a message shows it: hashes to 12 hex digits, long values cut."""
    if isinstance(v, str) and (key.endswith("sha256") or "fingerprint" in key):
        return v[:12]
    text = repr(v) if isinstance(v, str) else str(v)
    return text if len(text) <= SHOWN else text[:SHOWN - 3] + "..."


def _top(key: str) -> str:
    return key.split(".", 1)[0]


def listed_field(key: str) -> str | None:
    """The contract field a difference in ``key`` is named by (its cause ``contract.<field>``,
    replay/diff/causes.py) when the fact table lists ``key`` and the field is declared; None for an
    unlisted difference (cause ``unlisted_difference``)."""
    return _top(key) if fact_row(key) is not None and _top(key) in CONTRACT_FIELDS else None


def first_stage(key: str, contracts: Pair | None = None) -> str | None:
    """The first stage a difference in ``key`` acts in: the fact table's (``facts.fact_row``), except for a
    target decoder layer's weights (``target_weights`` / ``target_unloaded`` of ``...layers.K``): layer K
    changes HF hidden_states[K+1] on, so it acts at ``target.aux`` only when an aux slot captures one of
    those (both sides' ``aux_hf_indices``), else first at ``verify`` (the target's logits). None: no row
    lists ``key`` (stage unknown)."""
    row = fact_row(key)
    if row is None:
        return None
    name, _, unit = key.partition(".")
    if name in ("target_weights", "target_unloaded") and contracts is not None:
        from specdiff.tracer.contract import aux_slot_layers

        layer = unit.rsplit("layers.", 1)[-1].split(".")[0] if "layers." in unit else ""
        slots = [aux_slot_layers(c) for c in (contracts.x.contract, contracts.y.contract)]
        if layer.isdigit() and all(s is not None for s in slots):
            return "target.aux" if any(i > int(layer) for s in slots for i in s) else "verify"
    return row.stage


def mismatch(key: str, x, y, labels: Pair, *, xs: str | None = None, ys: str | None = None,
             stage: str | None = None) -> ContractMismatch:
    """The ``ContractMismatch`` of one differing fact: listed (its first stage onward, ``stage`` or the fact
    table's, and its fix) or unlisted (stage unknown); ``xs`` / ``ys``: how each side's value is said
    (default ``shown``)."""
    xs = shown(key, x) if xs is None else xs
    ys = shown(key, y) if ys is None else ys
    row = fact_row(key)
    if row is None:
        return ContractMismatch(key, "warn", x, y, f"unlisted difference: {key}: {labels.x} {xs}, {labels.y} {ys}; "
                                "stage unknown", (), "")
    at = stage or row.stage
    stages = STAGE_ORDER[STAGE_ORDER.index(at):]
    return ContractMismatch(key, "warn", x, y, f"{key}: {labels.x} {xs}, {labels.y} {ys} (acts from {at})",
                            stages, row.fix)


def _engine(c: dict) -> str | None:
    return known(c, "engine")


def _title(name: str | None) -> str:
    try:
        return engine_spec(str(name)).title
    except UnknownEngineError:
        return str(name or "the engine")


def _plain_facts(cx: dict, cy: dict, labels: Pair, worded: frozenset) -> list[ContractMismatch]:
    """Top-level facts neither check.py (``worded``) nor this module's dict comparisons word."""
    out = []
    for key in sorted(set(cx) & set(cy)):
        if key in worded or key in NEW_FACTS or not_compared(key) is not None:
            continue
        x, y = cx[key], cy[key]
        if any(isinstance(v, str) and v == UNKNOWN for v in (x, y)):
            continue
        if _norm(x) != _norm(y):
            out.append(mismatch(key, x, y, labels))
    return out


def _norm(v):
    return [_norm(i) for i in v] if isinstance(v, (list, tuple)) else v


def _structure(name: str, cx: dict, cy: dict, labels: Pair) -> list[ContractMismatch]:
    """Two models of one engine as built, one line per unit (``weight_unit``) whose parameters differ in
    name, shape or dtype, or that one model built and the other did not."""
    from specdiff.tracer.weight_facts import weight_unit

    sx, sy = dict(cx[name]), dict(cy[name])
    units: dict[str, list[str]] = {}
    for p in sorted(set(sx) | set(sy)):
        if sx.get(p) != sy.get(p):  # a target's structure is kept per unit already
            units.setdefault(p if name == "target_structure" else weight_unit(p), []).append(p)
    return [mismatch(f"{name}.{unit}", [sx.get(p) for p in params], [sy.get(p) for p in params], labels,
                     xs=_built(sx, params), ys=_built(sy, params)) for unit, params in units.items()]


def _built(s: dict, params: list[str]) -> str:
    """How one model built ``params`` (its structure ``s``): the first two, or 'not built'."""
    built = [p for p in params if p in s]
    if not built:
        return "not built"
    return ", ".join(f"{p} {s[p]}" for p in built[:2]) + (f" (+{len(built) - 2} more)" if len(built) > 2 else "")


def _dict_fact(name: str, cx: dict, cy: dict, labels: Pair, one_sided: list[str]) -> list[ContractMismatch]:
    """Leaf by leaf; a key one side lacks is listed in ``one_sided`` (a config key one transformers
    version writes and another does not)."""
    fx, fy = flatten(cx[name], name), flatten(cy[name], name)
    out = []
    for key in sorted(set(fx) | set(fy)):
        if not_compared(key) is not None:
            continue
        if key not in fx or key not in fy:
            one_sided.append(key)
        elif _norm(canonical_value(key, fx[key])) != _norm(canonical_value(key, fy[key])):
            out.append(_cache_or_settings(_fixed_where_set(mismatch(key, fx[key], fy[key], labels), cx, cy, labels),
                                          cx, cy))
    return out


#: the config keys a rope table is built from (transformers' rope_parameters and its older spellings)
ROPE_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor", "head_dim")


def _cache_or_settings(m: ContractMismatch, cx: dict, cy: dict) -> ContractMismatch:
    """A ``target_rope`` / ``draft_rope`` table difference where both sides' configs (with what an option
    set) hold the same rope settings: the table was not built from other settings, so the fix names the
    live cos/sin cache (changed or lost after load), not the config. Unchanged where a config or its rope
    keys are not recorded on a side, or differ."""
    name = m.field.split(".", 1)[0]
    if name not in STATE_FACTS:
        return m
    config = "draft_config" if name == "draft_rope" else "target_config"

    def settings(c: dict):
        cfg, over = c.get(config), c.get(f"{config}_overrides")
        if not isinstance(cfg, dict):
            return None
        got = {k: cfg.get(k) for k in ROPE_KEYS}
        if isinstance(over, dict):
            got.update({k: v.get("value") for k, v in over.items() if k in ROPE_KEYS and isinstance(v, dict)})
        return {k: _norm(canonical_value(k, v)) for k, v in got.items()}

    sx, sy = settings(cx), settings(cy)
    if sx is None or sy is None or sx != sy or not any(v is not None for v in sx.values()):
        return m
    return replace(m, fix="the rope settings of both configs agree, so the live rotary cos/sin cache differs from "
                          "the one they build: serve with the rotary cos/sin cache as built at load (a cache changed or lost after "
                          "load is state no checkpoint holds; SGLang 0.5.23's get_rope shares one rotary between "
                          "target and draft layers of one rope setting, srt/layers/rotary_embedding/factory.py:158-170)")


def _fixed_where_set(m: ContractMismatch, cx: dict, cy: dict, labels: Pair) -> ContractMismatch:
    """A ``target_config`` / ``draft_config`` difference in a key an engine option set on a side (its
    ``<side>_config_overrides``): fixed at that option (the overrides row's fix), not in the config file,
    which may hold training's value (SGLang's --json-model-override-args sets the draft's config too)."""
    name, _, rest = m.field.partition(".")
    if name not in ("target_config", "draft_config"):
        return m
    key = rest.split(".", 1)[0]
    set_by = [(label, c[f"{name}_overrides"][key]) for label, c in ((labels.x, cx), (labels.y, cy))
              if isinstance(c.get(f"{name}_overrides"), dict) and isinstance(c[f"{name}_overrides"].get(key), dict)]
    if not set_by:
        return m
    where = "; ".join(f"on {label} by {entry.get('source', 'an unknown option')}" for label, entry in set_by)
    row = fact_row(f"{name}_overrides.{key}")
    return replace(m, fix=f"set {where}, not by the config file: {row.fix if row is not None else m.fix}")


def _overrides(name: str, cx: dict, cy: dict, labels: Pair) -> list[ContractMismatch]:
    """One line per config key an engine option set on one side and not (or to another value) on the other:
    ``{key: {value, source}}``, a key a side lacks is that side's own config value (no override)."""
    ox, oy = cx[name], cy[name]
    return [mismatch(f"{name}.{key}", ox.get(key), oy.get(key), labels, xs=_override(ox.get(key)),
                     ys=_override(oy.get(key)))
            for key in sorted(set(ox) | set(oy)) if _norm(ox.get(key)) != _norm(oy.get(key))]


def _override(entry) -> str:
    """One side's override as a message shows it: the value, then the option that set it."""
    if not isinstance(entry, dict):
        return "not overridden"
    return f"{shown('', entry.get('value'))} (set by {entry.get('source', 'an unknown option')})"


def _given_options(cx: dict, cy: dict, labels: Pair) -> list[ContractMismatch]:
    """Options the operator gave a serving engine, against that engine's defaults (the other side is
    training, or another engine): the reference computes what a correct pair's engine computes by default."""
    out = []
    for mine, is_y in ((cy, True), (cx, False)):
        given = mine.get("engine_options_given")
        if not isinstance(given, dict):
            if "engine_options_given" not in mine and isinstance(mine.get("engine_options"), dict) \
                    and mine.get("side") == "serve":
                label, other = (labels.y, labels.x) if is_y else (labels.x, labels.y)
                out.append(ContractMismatch("engine_options", "info", None, None, f"{label}'s engine options are "
                                            f"recorded, but not which were given ({_title(_engine(mine))} keeps no "
                                            f"record of it): not compared with {other}", (), ""))
            continue
        title = _title(_engine(mine))
        for name, entry in sorted(given.items()):
            key = f"engine_options.{name}"
            if not_compared(key) is not None or not isinstance(entry, dict) or _compared_as_computed(key, cx, cy):
                continue
            value, default = entry.get("value"), entry.get("default")
            said = f"{shown(key, default)} ({title}'s default, what the reference computes)"
            given_said = f"{shown(key, value)} (given)"
            out.append(mismatch(key, default, value, labels, xs=said, ys=given_said) if is_y else
                       mismatch(key, value, default, labels, xs=given_said, ys=said))
    return out


#: options whose effect both sides may record as computed: then that fact is compared, not the option
#: against the engine's default (a draft trained with a window is served correctly with the option)
COMPUTED_AS = {"engine_options.speculative_draft_window_size": "draft_attention_window"}


def _compared_as_computed(key: str, cx: dict, cy: dict) -> bool:
    fact = COMPUTED_AS.get(key)
    return fact is not None and all(isinstance(known(c, fact), list) for c in (cx, cy))


def _canonical(names: dict) -> dict:
    """Draft checkpoint names as SGLang loads them (``replay.model.weight_files.canonical_name``): one
    draft in the SpecForge and the speculators layouts names its tensors alike."""
    return {canonical_name(n): v for n, v in names.items()}


def _weights(name: str, traces: Pair, labels: Pair, one_sided: list[str]) -> list[ContractMismatch]:
    cx, cy = traces.x.contract, traces.y.contract
    wx, wy = dict(cx[name]), dict(cy[name])
    if name == "draft_weights" and set(wx) != set(wy):
        wx, wy = _canonical(wx), _canonical(wy)
    out = []
    for t in sorted(set(wx) | set(wy)):
        key = f"{name}.{t}"
        if t not in wx or t not in wy:
            one_sided.append(key)
        elif UNKNOWN not in (wx[t], wy[t]) and wx[t] != wy[t]:
            out.append(mismatch(key, wx[t], wy[t], labels, xs=f"fingerprint {wx[t]}", ys=f"fingerprint {wy[t]}",
                                stage=first_stage(key, traces)))
    return out


def _unloaded(name: str, traces: Pair, labels: Pair) -> list[ContractMismatch]:
    """Parameters one side's model built that its checkpoint did not provide, one line per unit."""
    from specdiff.tracer.weight_facts import weight_unit

    lx, ly = traces.x.contract.get(name), traces.y.contract.get(name)
    sets = [set(v) if isinstance(v, list) else None for v in (lx, ly)]
    units: dict[str, tuple[list, list]] = {}
    for i, s in enumerate(sets):
        other = sets[1 - i]
        for p in sorted(s or ()):
            if other is None or p not in other:
                units.setdefault(weight_unit(p), ([], []))[i].append(p)
    out = []
    for unit, (px, py) in sorted(units.items()):
        words = ["not recorded" if s is None else
                 f"{len(p)} parameter(s) its checkpoint did not provide, left as allocated: {', '.join(p[:3])}"
                 + (f" (+{len(p) - 3} more)" if len(p) > 3 else "") if p else "every one loaded"
                 for s, p in zip(sets, (px, py))]
        key = f"{name}.{unit}"
        out.append(mismatch(key, px, py, labels, xs=words[0], ys=words[1], stage=first_stage(key, traces)))
    return out


def fact_differences(traces: Pair, *, worded: frozenset = frozenset()) -> list[ContractMismatch]:
    """Every difference between the two contracts' facts (module doc) but the fields ``worded`` (the ones
    check.py compares and words itself), as ``ContractMismatch`` es (warnings, then the info lines),
    in key order."""
    cx, cy = traces.x.contract, traces.y.contract
    labels = side_names(traces)
    out = _plain_facts(cx, cy, labels, worded)
    one_sided: list[str] = []
    same_engine = _engine(cx) is not None and _engine(cx) == _engine(cy)
    for name in NEW_FACTS:
        have = [isinstance(c.get(name), (dict, list)) for c in (cx, cy)]
        if not all(have):
            if name == "engine_options" and not same_engine:
                out += _given_options(cx, cy, labels)
            elif name in UNLOADED_FACTS and any(have):
                out += _unloaded(name, traces, labels)
            continue
        if name in DICT_FACTS:
            out += (_dict_fact(name, cx, cy, labels, one_sided) if name != "engine_options" or same_engine
                    else _given_options(cx, cy, labels))
        elif name in WEIGHT_FACTS:
            out += _weights(name, traces, labels, one_sided)
        elif name in UNLOADED_FACTS:
            out += _unloaded(name, traces, labels)
        elif name in STATE_FACTS or (name in BUFFER_FACTS and same_engine):
            out += _dict_fact(name, cx, cy, labels, one_sided)
        elif name in OVERRIDE_FACTS:
            out += _overrides(name, cx, cy, labels)
        elif name in STRUCTURE_FACTS and same_engine:
            out += _structure(name, cx, cy, labels)
    out += _not_recorded(cx, cy, labels)
    if one_sided:
        more = f" (+{len(one_sided) - 8} more)" if len(one_sided) > 8 else ""
        out.append(ContractMismatch("one_sided_facts", "info", None, None,
                                    f"recorded by one side only, not compared: {', '.join(one_sided[:8])}{more}", (),
                                    ""))
    return out


def _not_recorded(cx: dict, cy: dict, labels: Pair) -> list[ContractMismatch]:
    """One info line per side that recorded none of the facts read whole (a trace from an older specdiff)
    while the other did: those are unknown for this pair, not equal."""
    out = []
    for label, c, other in ((labels.x, cx, cy), (labels.y, cy, cx)):
        missing = [f for f in NEW_FACTS if f in other and f not in c]
        if missing and len(missing) == len([f for f in NEW_FACTS if f in other]):
            out.append(ContractMismatch("live_facts", "info", None, None,
                                        f"{label} records no {', '.join(missing[:4])}"
                                        + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
                                        + " (a trace written before specdiff recorded them): unknown, not compared",
                                        (), f"re-record {label} with the current recorder to compare them"))
    return out


__all__ = ["DICT_FACTS", "NEW_FACTS", "fact_differences", "first_stage", "flatten", "listed_field", "mismatch",
           "shown"]
