"""The weight rules: every parameter the draft config implies present with its shape, keys the
engines skip or ignore, the embedding SGLang shares, dtypes (mixed, against the config, d2t / t2d),
the dtype SGLang serves the draft in, and a tied lm_head. The expected names and shapes come from
``replay.model.checkpoint``; the served dtype from ``preflight.engines.sglang_served_dtype``.
"""

from __future__ import annotations

import dataclasses
import re

from specdiff.eagle3.engines import REGISTRY
from specdiff.replay.model.weight_files import (
    OPTIONAL_SHAPES,
    canonical_name,
    expected_shapes,
    ignored_key,
    later_input_norm_aliases,
)
from specdiff.replay.preflight.engines import checked_specs, sglang_served_dtype
from specdiff.replay.preflight.files import DraftInfo, TargetInfo
from specdiff.replay.preflight.report import Finding

__all__ = ["check_weights", "check_served_dtype", "check_tied"]

#: a decoder layer's key as SGLang loads it (``model.`` prefix optional), group 1 = the layer index
_LAYER_KEY = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


def _config_dims(cfg, *, H: int, V: int) -> list[Finding]:
    """The draft config's target_hidden_size and vocab_size against the target's."""
    out: list[Finding] = []
    th = cfg.target_hidden_size
    if th != H:
        out.append(Finding("weights.target_hidden", "error", "all",
                           f"draft config target_hidden_size {th} but the target's hidden_size is {H}",
                           f"set target_hidden_size = {H} (and retrain: fc was built for {th})"))
    if cfg.vocab_size != V:
        out.append(Finding("vocab.size", "error", "all",
                           f"draft config vocab_size {cfg.vocab_size} but the target's is {V} (t2d and "
                           "the shared embedding are [V])", f"set vocab_size = {V}"))
    return out


def _sort_keys(draft: DraftInfo, expected: dict) -> tuple[dict[str, str], list[str], list[str]]:
    """The checkpoint's keys as (canonical name -> file name of the known ones, unexpected, ignored)."""
    canon: dict[str, str] = {}
    unexpected, ignored = [], []
    aliases = later_input_norm_aliases(draft.tensors)
    for name in draft.tensors:
        if name in aliases:  # a speculators-format later layer's input norm (replay/preflight/rules/layers.py)
            canon[aliases[name]] = name
            continue
        if ignored_key(name):
            ignored.append(name)
            continue
        c = canonical_name(name)
        if c not in expected and c not in OPTIONAL_SHAPES:
            unexpected.append(name)
        else:
            canon[c] = name
    return canon, unexpected, ignored


def _missing(cfg, *, expected: dict, canon: dict[str, str]) -> list[Finding]:
    """Parameters the config implies that the checkpoint lacks (SGLang's lm_head from the target excepted)."""
    out: list[Finding] = []
    for k in expected:
        if k in canon:
            continue
        if k == "lm_head.weight" and cfg.lm_head_from_target:
            out.append(Finding("weights.lm_head_from_target", "info", "sglang",
                               "no lm_head.weight and no draft_vocab_size: SGLang loads the target's lm_head",
                               ""))
            continue
        out.append(Finding("weights.missing", "error", "all",
                           f"{k} {list(expected[k])} is missing: the engines leave that parameter "
                           "uninitialised (SGLang skips it silently)",
                           "re-export the checkpoint with every draft parameter"))
    return out


def _shapes(draft: DraftInfo, cfg_t, *, expected: dict, canon: dict[str, str], H: int, engines) -> list[Finding]:
    """Each known parameter's shape against what the config (with the target's dims) implies."""
    cfg = draft.config
    specs = checked_specs(engines)
    out: list[Finding] = []
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
            elif c == "embed_tokens.weight" and specs and all(s.replaces_draft_embed for s in specs):
                continue  # every engine checked replaces it anyway (reported below)
            else:
                msg = f"{name} is {list(shape)} but the config implies {list(want)}"
            out.append(Finding("weights.shape", "error", "all", msg,
                               "fix the config dims or re-export the weights so they agree"))
    return out


def _skipped(unexpected: list[str], ignored: list[str]) -> list[Finding]:
    """Keys that match no draft parameter, and keys the engines ignore by design."""
    out: list[Finding] = []
    if unexpected:
        out.append(Finding("weights.unexpected", "warn", "all",
                           f"{len(unexpected)} key(s) match no draft parameter and are skipped silently: "
                           + ", ".join(sorted(unexpected)[:6]) + (" ..." if len(unexpected) > 6 else ""),
                           "check the flags (norm_before_fc, fc_norm) and names; trained weights may be unused"))
    if ignored:
        out.append(Finding("weights.ignored", "info", "all",
                           "ignored by the engines: " + ", ".join(sorted(ignored)), ""))
    return out


def _extra_layers(cfg, names: list[str]) -> list[Finding]:
    """Decoder layers the checkpoint holds beyond ``num_hidden_layers``: SGLang 0.5.23 builds the
    configured number (llama_eagle3.py:198-204) and skips any other ``layers.{i}.*`` key silently
    (load_weights, :370-378), so the draft is served shallower than it was trained."""
    extra = sorted({int(m.group(1)) for n in names if (m := _LAYER_KEY.match(n))
                    and int(m.group(1)) >= cfg.num_hidden_layers})
    if not extra:
        return []
    return [Finding("weights.layers", "error", "all",
                    f"the checkpoint holds decoder layer(s) {extra} but num_hidden_layers is {cfg.num_hidden_layers}: "
                    "SGLang 0.5.23 builds only the configured layers (llama_eagle3.py:198-204) and skips the others' "
                    "weights silently (:370-378)",
                    f"set num_hidden_layers to {extra[-1] + 1}, the decoder layers the checkpoint holds")]


def _embedding(cfg, *, canon: dict[str, str], H: int, V: int, engines) -> list[Finding]:
    """The draft's own embed_tokens: replaced by an engine that serves the target's
    (``EngineSpec.replaces_draft_embed``; SGLang), or missing where the target's cannot serve."""
    out: list[Finding] = []
    has_embed = "embed_tokens.weight" in canon
    if has_embed and cfg.target_hidden_size == cfg.hidden_size:
        # set_embed keeps the draft's own embedding only when the hidden sizes differ (llama.py:912-916)
        keep = " or ".join(s.title for s in REGISTRY.values() if not s.replaces_draft_embed)
        out += [Finding("weights.ignored", "info", spec.name,
                        f"embed_tokens.weight is in the checkpoint but {spec.label} replaces it with the "
                        "target's embedding (speculative/eagle_worker_v2.py:363 -> set_embed, "
                        "srt/models/llama.py:917-918): a draft trained with its own embedding is served "
                        "with another one",
                        "train with the target's embedding frozen" + (f", or serve with {keep}" if keep else ""))
                for spec in checked_specs(engines) if spec.replaces_draft_embed]
    if not has_embed and cfg.hidden_size != H:
        out.append(Finding("weights.embed", "error", "all",
                           f"no embed_tokens.weight: the engines share the target's embedding [{V}, {H}] "
                           f"but the draft hidden is {cfg.hidden_size}",
                           "ship embed_tokens.weight in the checkpoint"))
    return out


def _dtypes(draft: DraftInfo, *, canon: dict[str, str]) -> list[Finding]:
    """Mixed float dtypes, a config dtype the weights are not in, and d2t / t2d stored as the wrong dtype."""
    out: list[Finding] = []
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


def check_weights(draft: DraftInfo, target: TargetInfo, *, engines) -> list[Finding]:
    """Every expected key present with the right shape; missing / unexpected / ignored keys; dtype."""
    cfg = draft.config
    H, V = target.hidden_size, target.vocab_size
    out = _config_dims(cfg, H=H, V=V)
    cfg_t = dataclasses.replace(cfg, target_hidden_size=H, vocab_size=V)
    expected = expected_shapes(cfg_t)
    canon, unexpected, ignored = _sort_keys(draft, expected)
    out += _missing(cfg, expected=expected, canon=canon)
    out += _shapes(draft, cfg_t, expected=expected, canon=canon, H=H, engines=engines)
    out += _skipped(unexpected, ignored)
    out += _extra_layers(cfg, unexpected + ignored)
    out += _embedding(cfg, canon=canon, H=H, V=V, engines=engines)
    out += _dtypes(draft, canon=canon)
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
