"""Pre-flight contract check: what each engine will really feed an EAGLE-3 draft, from files only.

``specdiff check --target T --draft D`` reads the target's config.json (never its weights), the
draft's config.json, safetensors headers (shapes and dtypes without loading) and the draft's
``d2t`` / ``t2d``, and returns ``Finding`` rows plus the per-engine resolved aux capture.

Engine behaviour encoded here (DESIGN.md "EAGLE-3 facts"; shared/research):

- SGLang 0.5.23 reads aux ids only from ``eagle_config.eagle_aux_hidden_state_layer_ids``
  (spec_aux_hidden_state.py:185-196); id k captures HF ``hidden_states[k+1]``, id -1 the
  embeddings, id L-1 maps to index L which is never reached (llama.py
  ``set_eagle3_layers_to_capture``: ``[val + 1 for val in layer_ids]``); no ids: HF
  [2, L//2, L-3]. fc is built for K = ``num_aux_hidden_states`` / len(eagle ids) / 3 slots
  (llama_eagle3.py:156-161) and is *skipped* when the aux width equals the draft hidden
  (llama_eagle3.py:238). Unknown weight names are skipped silently, a wrong shape fails the
  load; the draft's ``embed_tokens`` is replaced by the target's (eagle_worker_v2.init_lm_head);
  t2d is ignored, ``hot_token_id = d2t + arange``. There is no model class for the speculators
  format (``Eagle3DraftModel``).
- vLLM: top-level ``eagle_aux_hidden_state_layer_ids`` first, else eagle_config's, taken
  literally: id k = HF index k (captured before decoder layer k, so 0..L-1 are reachable; -1
  and L never match). Measured crash with a missing slot: ``shape '[-1, K*H]' is invalid``
  (shared/research/vllm-cpu.md).

Everything here is a pure function of the parsed inputs; ``run_preflight`` does the reading.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdiff.eagle3.aux_layers import CONVENTIONS, ConventionError, default_hf_indices, resolve_aux_ids
from specdiff.replay.model.checkpoint import (
    _IGNORED,
    _OPTIONAL_SHAPES,
    SPECFORGE_ARCH,
    SPECULATORS_ARCHS,
    CheckpointError,
    _canonical_name,
    _expected_shapes,
    _rope,
    detect_format,
    draft_config_from_dict,
    native_aux_ids,
)
from specdiff.tracer.contract import tokenizer_hashes
from specdiff.tracer.errors import SpecdiffError

__all__ = ["PreflightError", "Finding", "EngineCapture", "TargetInfo", "DraftInfo", "PreflightReport",
           "ENGINES", "SEVERITIES", "read_target", "read_draft", "run_preflight", "findings_as_facts",
           "resolve_engine_capture", "check_aux", "check_training", "check_weights", "check_vocab",
           "check_norms", "check_rope", "check_algorithm", "check_tokenizer"]

ENGINES = ("sglang", "vllm")
SEVERITIES = ("error", "warn", "info")
_ENGINE_NAME = {"sglang": "SGLang", "vllm": "vLLM", "all": "all engines"}
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32",
              "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class PreflightError(SpecdiffError):
    """Input that cannot be checked at all (no config.json, unreadable weights, not a model)."""


@dataclass(frozen=True)
class Finding:
    """One pre-flight finding.

    Attributes:
        kind: dotted category, e.g. ``aux.dropped_id``, ``vocab.d2t_direct``, ``weights.shape``.
        severity: 'error' (serving will crash or be wrong), 'warn' (likely wrong) or 'info'.
        engine: 'sglang', 'vllm' or 'all'.
        message: one line of evidence.
        fix: what to change (may be empty).
    """

    kind: str
    severity: str
    engine: str
    message: str
    fix: str = ""

    def as_fact(self) -> dict:
        return {"kind": self.kind, "severity": self.severity, "engine": self.engine,
                "message": self.message, "fix": self.fix}


def findings_as_facts(findings) -> list[dict]:
    """Findings as JSON/msgpack-safe dicts for the contract field ``findings``."""
    return [f.as_fact() for f in findings]


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
    """

    engine: str
    source: str
    native_ids: tuple[int, ...] | None
    convention: str
    hf_indices: tuple[int, ...]
    dropped_ids: tuple[int, ...]
    slots_expected: int
    outcome: str

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}


@dataclass
class TargetInfo:
    path: str
    config: dict
    num_layers: int
    hidden_size: int
    vocab_size: int
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int | None
    eos_token_ids: tuple[int, ...]
    tokenizer_sha256: str | None
    chat_template_sha256: str | None


@dataclass
class DraftInfo:
    path: str
    raw: dict
    format: str | None  # None: not an EAGLE-3 checkpoint
    config: object | None  # Eagle3DraftConfig
    notes: list[str]
    tensors: dict[str, tuple[tuple[int, ...], str]]  # file name -> (shape, dtype)
    d2t: torch.Tensor | None
    t2d: torch.Tensor | None
    tokenizer_sha256: str | None
    chat_template_sha256: str | None


@dataclass
class PreflightReport:
    target: TargetInfo
    draft: DraftInfo
    engines: tuple[str, ...]
    captures: dict[str, EngineCapture]
    training_hf: tuple[int, ...] | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def as_dict(self) -> dict:
        t, d = self.target, self.draft
        c = d.config
        return {
            "target": {"path": t.path, "num_layers": t.num_layers, "hidden_size": t.hidden_size,
                       "vocab_size": t.vocab_size},
            "draft": {"path": d.path, "format": d.format,
                      "hidden_size": getattr(c, "hidden_size", None),
                      "draft_vocab_size": getattr(c, "draft_vocab_size", None),
                      "num_aux": getattr(c, "num_aux", None)},
            "engines": list(self.engines),
            "captures": {e: cap.as_dict() for e, cap in self.captures.items()},
            "training_hf_indices": None if self.training_hf is None else list(self.training_hf),
            "findings": findings_as_facts(self.findings),
            "counts": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
        }


# ---- reading ----------------------------------------------------------------------------
def _sha(data: bytes | str | None) -> str | None:
    if data is None:
        return None
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def _load_json(f: Path, what: str) -> dict:
    try:
        d = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PreflightError(f"{what} {f}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise PreflightError(f"{what} {f}: expected a JSON object, got {type(d).__name__}")
    return d


def _model_dir(path, what: str) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise PreflightError(f"{what} {p}: not a directory (a local Hugging Face model directory is needed)")
    if not (p / "config.json").is_file():
        raise PreflightError(f"{what} {p}: no config.json (not a Hugging Face model directory)")
    return p


def _tokenizer_hashes(p: Path) -> tuple[str | None, str | None]:
    return tokenizer_hashes(p)


def read_target(path) -> TargetInfo:
    """The target's dims, rope, eos ids and tokenizer hashes from config.json and tokenizer files."""
    p = _model_dir(path, "target")
    raw = _load_json(p / "config.json", "target config")
    d = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if not isinstance(d.get(k), int)]
    if missing:
        raise PreflightError(f"target {p}: config.json lacks {', '.join(missing)} (not a decoder model config)")
    theta, scaling = _rope(d)
    eos = d.get("eos_token_id", raw.get("eos_token_id"))
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int))
    tok_sha, tmpl_sha = _tokenizer_hashes(p)
    return TargetInfo(path=str(p), config=raw, num_layers=d["num_hidden_layers"], hidden_size=d["hidden_size"],
                      vocab_size=d["vocab_size"], rope_theta=theta, rope_scaling=scaling,
                      max_position_embeddings=d.get("max_position_embeddings"), eos_token_ids=eos_ids,
                      tokenizer_sha256=tok_sha, chat_template_sha256=tmpl_sha)


def _read_tensors(p: Path) -> tuple[dict, torch.Tensor | None, torch.Tensor | None]:
    """(name -> (shape, dtype)) from safetensors headers (else .bin with weights_only), plus d2t/t2d."""
    files = sorted(p.glob("*.safetensors"))
    meta: dict[str, tuple[tuple[int, ...], str]] = {}
    d2t = t2d = None
    if files:
        from safetensors import safe_open
        for f in files:
            try:
                with safe_open(str(f), framework="pt") as sf:
                    for name in sf.keys():
                        sl = sf.get_slice(name)
                        meta[name] = (tuple(sl.get_shape()), _ST_DTYPES.get(sl.get_dtype(), sl.get_dtype().lower()))
                        canon = _canonical_name(name)
                        if canon == "d2t":
                            d2t = sf.get_tensor(name)
                        elif canon == "t2d":
                            t2d = sf.get_tensor(name)
            except Exception as e:  # corrupt header, truncated file
                raise PreflightError(f"draft weights {f}: unreadable safetensors ({type(e).__name__}: {e})") from None
        return meta, d2t, t2d
    bins = sorted(p.glob("*.bin"))
    if not bins:
        raise PreflightError(f"draft {p}: no *.safetensors or *.bin weights found")
    for f in bins:
        try:
            sd = torch.load(str(f), map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:
            raise PreflightError(f"draft weights {f}: unreadable (weights_only=True: {type(e).__name__}: {e})") from None
        for name, t in sd.items():
            meta[name] = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
            canon = _canonical_name(name)
            if canon == "d2t":
                d2t = t.clone()
            elif canon == "t2d":
                t2d = t.clone()
    return meta, d2t, t2d


def read_draft(path) -> DraftInfo:
    """The draft's config (format detected), tensor shapes/dtypes, d2t / t2d and tokenizer hashes.

    A config whose architectures are not EAGLE-3 gives ``format None`` (reported as a finding);
    a directory without config.json, without a model config or with unreadable weights raises
    PreflightError.
    """
    p = _model_dir(path, "draft")
    raw = _load_json(p / "config.json", "draft config")
    inner = raw.get("transformer_layer_config") if isinstance(raw.get("transformer_layer_config"), dict) else raw
    if not raw.get("architectures") and "hidden_size" not in inner:
        raise PreflightError(f"draft {p}: config.json has neither architectures nor hidden_size (not a model)")
    tensors, d2t, t2d = _read_tensors(p)
    try:
        fmt = detect_format(raw)
    except CheckpointError:
        fmt = None
    cfg, notes = (None, [])
    if fmt is not None:
        try:
            cfg, notes = draft_config_from_dict(raw, fmt)
        except CheckpointError as e:
            raise PreflightError(f"draft {p}: {e}") from None
    tok_sha, tmpl_sha = _tokenizer_hashes(p)
    return DraftInfo(path=str(p), raw=raw, format=fmt, config=cfg, notes=notes, tensors=tensors,
                     d2t=d2t, t2d=t2d, tokenizer_sha256=tok_sha, chat_template_sha256=tmpl_sha)


# ---- aux capture ------------------------------------------------------------------------
def _label(i: int, L: int) -> str:
    """Plain name of HF hidden_states[i]."""
    if i == 0:
        return "embed"
    if i == L:
        return "final-norm"
    return f"out L{i - 1}"


def _fmt_hf(indices, L: int) -> str:
    return "[" + ", ".join(f"{i} ({_label(i, L)})" for i in indices) + "]"


def _ids_or_none(v):
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise PreflightError(f"draft config: eagle_aux_hidden_state_layer_ids {v!r} is not a list of ints")
    return tuple(v)


def _sglang_k(raw: dict) -> int:
    """K as SGLang builds fc (llama_eagle3.py:156-161)."""
    k = raw.get("num_aux_hidden_states")
    if k is None:
        ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        k = len(ids) if ids else 3
    return int(k)


def resolve_engine_capture(engine: str, *, raw: dict, fmt: str, num_layers: int, k_fc: int,
                           aux_width: int, draft_hidden: int) -> EngineCapture:
    """The HF indices ``engine`` captures for this draft config on an L-layer target.

    ``k_fc``: slots fc expects; ``aux_width``: width per slot (target H); ``draft_hidden``: Hd
    (SGLang skips fc when the arriving width equals it).
    """
    L = num_layers
    eagle = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    e_ids = _ids_or_none(eagle.get("eagle_aux_hidden_state_layer_ids"))
    t_ids = _ids_or_none(raw.get("eagle_aux_hidden_state_layer_ids"))
    if engine == "sglang":
        if fmt == "speculators":
            return EngineCapture("sglang", "none", None, "sglang", (), (), k_fc, "unsupported")
        ids, source = (e_ids, "eagle_config") if e_ids else (None, "default")
        if ids is None:
            hf, dropped = default_hf_indices(L), ()
        else:
            got = []
            dropped_l = []
            for i in ids:
                if -1 <= i <= L - 2:
                    got.append(i + 1)
                else:
                    dropped_l.append(i)
            hf, dropped = tuple(sorted(set(got))), tuple(dropped_l)
        conv = "sglang"
    else:
        if t_ids is not None:
            ids, source = t_ids, "top-level"
        elif e_ids:
            ids, source = e_ids, "eagle_config"
        else:
            ids, source = None, "default"
        if ids is None:
            hf, dropped = default_hf_indices(L), ()
        else:
            hf = tuple(sorted({i for i in ids if 0 <= i <= L - 1}))
            dropped = tuple(i for i in ids if not 0 <= i <= L - 1)
        conv = "vllm"
    hf = tuple(sorted(set(hf)))
    if len(hf) == k_fc:
        outcome = "ok"
    elif engine == "sglang" and len(hf) * aux_width == draft_hidden:
        outcome = "fc-skipped"
    else:
        outcome = "crash"
    return EngineCapture(engine, source, ids, conv, hf, dropped, k_fc, outcome)


def check_aux(captures: dict[str, EngineCapture], *, raw: dict, num_layers: int, aux_width: int,
              training_hf: tuple[int, ...] | None) -> list[Finding]:
    """Findings about the aux capture: ignored keys, dropped ids, slot-count crashes, defaults,
    engines that disagree."""
    L = num_layers
    out: list[Finding] = []
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
    if sg is not None and sg.outcome != "unsupported" and not e_ids and t_ids is not None:
        default = default_hf_indices(L)
        meanings = set()
        for conv in ("hf", "sglang"):
            try:
                meanings.add(resolve_aux_ids(t_ids, convention=conv, num_layers=L).hf_indices)
            except ConventionError:
                pass
        sev = "warn" if tuple(default) in meanings else "error"
        want = native_aux_ids(sorted(set(int(i) for i in t_ids if 0 <= int(i) <= L - 1)), "sglang") \
            if all(isinstance(i, int) for i in t_ids) else t_ids
        out.append(Finding("aux.ignored_key", sev, "sglang",
                           f"eagle_aux_hidden_state_layer_ids {list(t_ids)} is only at the top level: SGLang "
                           f"ignores it and captures its default HF {_fmt_hf(default, L)}",
                           "put the ids in eagle_config.eagle_aux_hidden_state_layer_ids (SGLang convention: "
                           f"HF index - 1; e.g. HF indices {sorted(set(int(i) for i in t_ids))} -> {want})"))
    for eng, cap in captures.items():
        name = _ENGINE_NAME[eng]
        if cap.outcome == "unsupported":
            continue
        for i in cap.dropped_ids:
            if eng == "sglang":
                why = (f"maps to capture index {i + 1}, which is never reached (only layers 0..{L - 1} run)"
                       if i >= L - 1 else f"maps to capture index {i + 1}, which no layer has")
                fix = ("the output of the last decoder layer cannot be captured by SGLang; use an earlier "
                       "layer (id L-2 = HF L-1) and retrain, or drop the id and K" if i == L - 1 else
                       f"use ids in -1..{L - 2} (id k = HF k+1; -1 = embeddings)")
            else:
                why = ("never matches a layer index (vLLM has no id for the embeddings)" if i < 0 else
                       f"is past the last layer index {L - 1}")
                fix = (f"write vLLM ids at the top level: id k = HF index k, 0..{L - 1}"
                       " (HF 0 = embeddings)")
            out.append(Finding("aux.dropped_id", "error", eng,
                               f"{cap.source} id {i} {why}: {name} silently drops that slot", fix))
        got = len(cap.hf_indices)
        if cap.outcome == "crash":
            if eng == "sglang":
                msg = (f"{name} captures {got} slot(s) HF {_fmt_hf(cap.hf_indices, L)} but fc expects "
                       f"{cap.slots_expected} x {aux_width}: the first request crashes with 'mat1 and mat2 "
                       f"shapes cannot be multiplied (Nx{got * aux_width} and "
                       f"{cap.slots_expected * aux_width}xHd)'")
            else:
                msg = (f"{name} captures {got} slot(s) HF {_fmt_hf(cap.hf_indices, L)} but fc expects "
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
                               f"no aux ids for {name}: it captures its default HF {_fmt_hf(cap.hf_indices, L)} "
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
                           f"SGLang captures HF {_fmt_hf(ok['sglang'].hf_indices, L)} but vLLM captures HF "
                           f"{_fmt_hf(ok['vllm'].hf_indices, L)} from the same config: the draft is right "
                           "for at most one of them",
                           "state the training layers with --training-layers; write SGLang ids in "
                           "eagle_config and vLLM ids (HF indices) at the top level"))
    return out


def check_training(captures: dict[str, EngineCapture], training_hf: tuple[int, ...] | None, *,
                   num_layers: int) -> list[Finding]:
    """Per engine: do the layers it feeds equal the layers the draft was trained on?"""
    if training_hf is None:
        return []
    L = num_layers
    out = []
    for eng, cap in captures.items():
        if cap.outcome == "unsupported":
            continue
        name = _ENGINE_NAME[eng]
        if cap.hf_indices == training_hf:
            out.append(Finding("training.match", "info", eng,
                               f"{name} feeds HF {_fmt_hf(cap.hf_indices, L)} = the training layers", ""))
            continue
        pairs = ", ".join(f"slot {j}: trained on {_label(t, L)}, gets {_label(s, L)}"
                          for j, (t, s) in enumerate(zip(training_hf, cap.hf_indices)) if t != s)
        ascending = sorted(training_hf)
        reorder = (f"{name} always concatenates in ascending layer order, whatever the id order: retrain "
                   f"with the layers listed ascending, or reorder fc.weight's {len(training_hf)} column blocks "
                   f"from HF {list(training_hf)} to HF {ascending}")
        if ascending == list(cap.hf_indices):
            out.append(Finding("training.aux_order", "error", eng,
                               f"{name} feeds the training layers in ascending order HF "
                               f"{_fmt_hf(cap.hf_indices, L)} but training concatenated them as HF "
                               f"{_fmt_hf(training_hf, L)} ({pairs}): fc multiplies each slot by the weights "
                               "trained for another layer", reorder))
            continue
        if eng == "sglang":
            if L in training_hf or any(i > L for i in training_hf):
                fix = "SGLang cannot capture the final-norm output (HF L): retrain on other layers"
            else:
                fix = (f"set eagle_config.eagle_aux_hidden_state_layer_ids = "
                       f"{native_aux_ids(ascending, 'sglang')}")
        else:
            if any(i >= L for i in training_hf):
                fix = "vLLM captures only HF 0..L-1: retrain on other layers"
            else:
                fix = f"set top-level eagle_aux_hidden_state_layer_ids = {ascending}"
        if list(training_hf) != ascending:
            fix += f"; also: {reorder}"
        out.append(Finding("training.mismatch", "error", eng,
                           f"{name} feeds HF {_fmt_hf(cap.hf_indices, L)} but training used HF "
                           f"{_fmt_hf(training_hf, L)}" + (f" ({pairs})" if pairs else ""), fix))
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
    cfg_t = dataclasses.replace(cfg, target_hidden_size=H, vocab_size=V, extra=dict(cfg.extra))
    expected = _expected_shapes(cfg_t)
    canon: dict[str, str] = {}
    unexpected, ignored = [], []
    for name in draft.tensors:
        if name in _IGNORED or name.endswith("rotary_emb.inv_freq"):
            ignored.append(name)
            continue
        c = _canonical_name(name)
        if c not in expected and c not in _OPTIONAL_SHAPES:
            unexpected.append(name)
        else:
            canon[c] = name
    lm_from_target = not cfg.extra.get("draft_vocab_size_in_config")
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
        want = expected[c] if c in expected else _OPTIONAL_SHAPES[c](cfg_t)
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
    if has_embed and "sglang" in engines:
        out.append(Finding("weights.ignored", "info", "sglang",
                           "embed_tokens.weight is in the checkpoint but SGLang replaces it with the "
                           "target's embedding (init_lm_head -> set_embed)",
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
def _strictly_increasing(x: torch.Tensor) -> bool:
    return x.numel() < 2 or bool((x[1:] > x[:-1]).all())


def check_vocab(d2t: torch.Tensor | None, t2d: torch.Tensor | None, *, draft_vocab_size: int,
                vocab_size: int, eos_token_ids=()) -> list[Finding]:
    """d2t present, in range, consistent with t2d; direct ids / arange; coverage."""
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
    ar = torch.arange(Vd)
    mapped = d2t + ar
    t2d_set = None
    if t2d is not None:
        t2d = t2d.reshape(-1).to(torch.bool)
        if t2d.numel() == V:
            t2d_set = torch.nonzero(t2d).reshape(-1)
        else:
            out.append(Finding("vocab.t2d_shape", "warn", "all",
                               f"t2d has {t2d.numel()} entries but the target vocab is {V} (engines ignore t2d)",
                               ""))
    direct_valid = _strictly_increasing(d2t) and int(d2t.min()) >= 0 and int(d2t.max()) < V
    in_range = int(mapped.min()) >= 0 and int(mapped.max()) < V
    offsets_match = t2d_set is not None and torch.equal(torch.sort(mapped).values, t2d_set)
    direct_match = t2d_set is not None and direct_valid and torch.equal(d2t, t2d_set)
    is_arange = Vd > 1 and torch.equal(d2t, ar)
    looks_direct = direct_valid and not offsets_match and (direct_match or not in_range)
    if looks_direct:
        ev = ("t2d marks exactly the ids d2t holds" if direct_match else
              f"read as offsets, draft id {int(torch.argmax(mapped))} maps to {int(mapped.max())} >= V={V}")
        out.append(Finding("vocab.d2t_direct", "error", "all",
                           f"d2t holds direct target ids, not offsets ({ev}); engines use d2t + arange, so "
                           f"draft id i is served as d2t[i] + i",
                           "store offsets: d2t = target_ids - arange(Vd)"))
        return out
    if direct_valid and t2d_set is None and Vd > 2 and in_range and not is_arange:
        out.append(Finding("vocab.d2t_direct", "warn", "all",
                           f"d2t is strictly increasing ({int(d2t[0])}, {int(d2t[1])}, {int(d2t[2])}, ...) and "
                           "there is no t2d to confirm: offsets of a sorted vocab usually repeat, so these "
                           "may be direct target ids", "ship t2d, or check that d2t = target_ids - arange(Vd)"))
    if not in_range:
        bad = torch.nonzero((mapped < 0) | (mapped >= V)).reshape(-1)
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
    uniq = torch.unique(mapped)
    if uniq.numel() != Vd:
        out.append(Finding("vocab.d2t_duplicate", "error", "all",
                           f"d2t + arange maps {Vd} draft ids onto only {uniq.numel()} target ids",
                           "rebuild d2t: each draft id must map to a distinct target id"))
    if t2d_set is not None and not offsets_match:
        marked = torch.zeros(V, dtype=torch.bool)
        marked[mapped] = True
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
    pct = 100.0 * uniq.numel() / V
    out.append(Finding("vocab.coverage", "info", "all",
                       f"draft vocab covers {uniq.numel()} of {V} target tokens ({pct:.1f}%)", ""))
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
    canon = {_canonical_name(n) for n in draft.tensors}
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
        flags = [n for n, v in (("norm_before_fc", cfg.norm_before_fc), ("fc_norm", cfg.fc_norm)) if v]
        out.append(Finding("norm.flags", "info", "all",
                           f"{' and '.join(flags)} set: SGLang applies input_norm over the K*H concat, then "
                           "fc_norm per slot, then fc (llama_eagle3.py:239-246)", ""))
    if "norm_output" in raw or "norm_output" in (raw.get("eagle_config") or {}):
        out.append(Finding("norm.norm_output", "warn" if cfg.norm_output else "info", "sglang",
                           f"norm_output={cfg.norm_output}: in SGLang true means the next draft step gets the "
                           "normed hidden; SpecForge's flag of the same name means the opposite",
                           "check which hidden (pre- or post-norm) training fed back, and set the flag for SGLang"))
    if cfg.norm_before_residual and "sglang" in engines:
        out.append(Finding("norm.norm_before_residual", "error", "sglang",
                           "norm_before_residual=true (speculators): SGLang 0.5.23 does not implement it "
                           "(residual = raw hidden)", "serve with vLLM or retrain without it"))
    return out


def _scaling_key(s):
    return json.dumps(s, sort_keys=True) if s else None


def check_rope(draft: DraftInfo, target: TargetInfo) -> list[Finding]:
    """rope theta / scaling / max positions of the draft vs the target."""
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
    tm = target.max_position_embeddings
    if tm is not None and cfg.max_position_embeddings < tm:
        out.append(Finding("rope.max_positions", "warn", "all",
                           f"draft max_position_embeddings {cfg.max_position_embeddings} < target {tm}: "
                           "positions past the draft's limit index beyond its rope cache",
                           f"set max_position_embeddings = {tm} in the draft config"))
    return out


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


# ---- driver -----------------------------------------------------------------------------
def _training_hf(layers, convention: str, num_layers: int) -> tuple[int, ...] | None:
    if layers is None:
        return None
    if convention not in CONVENTIONS:
        raise PreflightError(f"--training-convention {convention!r}: use one of {', '.join(CONVENTIONS)}")
    try:
        return resolve_aux_ids(list(layers), convention=convention, num_layers=num_layers,
                               concat="listed").hf_indices
    except ConventionError as e:
        raise PreflightError(f"--training-layers {list(layers)}: {e}") from None


def run_preflight(target, draft, *, engines=ENGINES, training_layers=None, training_convention: str = "hf",
                  speculative_algorithm: str | None = "EAGLE3") -> PreflightReport:
    """Read both directories and return the report (findings ordered error, warn, info).

    Raises:
        PreflightError: a directory that cannot be checked (one line).
    """
    engines = tuple(e for e in ENGINES if e in engines)
    if not engines:
        raise PreflightError("no engine selected: use sglang, vllm or all")
    t = read_target(target)
    d = read_draft(draft)
    train_hf = _training_hf(training_layers, training_convention, t.num_layers)
    findings: list[Finding] = []
    captures: dict[str, EngineCapture] = {}
    findings += check_algorithm(d, speculative_algorithm, target_hidden=t.hidden_size)
    if d.format is not None:
        cfg = d.config
        fc_shape = next((shape for n, (shape, _) in d.tensors.items() if _canonical_name(n) == "fc.weight"), None)
        k_weights = (fc_shape[1] // t.hidden_size if fc_shape is not None and len(fc_shape) == 2
                     and fc_shape[1] % t.hidden_size == 0 else cfg.num_aux)
        for e in engines:
            k = _sglang_k(d.raw) if (e == "sglang" and d.format == "specforge") else k_weights
            captures[e] = resolve_engine_capture(e, raw=d.raw, fmt=d.format, num_layers=t.num_layers, k_fc=k,
                                                 aux_width=t.hidden_size, draft_hidden=cfg.hidden_size)
        findings += check_aux(captures, raw=d.raw, num_layers=t.num_layers, aux_width=t.hidden_size,
                              training_hf=train_hf)
        findings += check_training(captures, train_hf, num_layers=t.num_layers)
        findings += check_weights(d, t, engines=engines)
        findings += check_vocab(d.d2t, d.t2d, draft_vocab_size=cfg.draft_vocab_size, vocab_size=t.vocab_size,
                                eos_token_ids=t.eos_token_ids)
        findings += check_norms(d, engines=engines)
        findings += check_rope(d, t)
    findings += check_tokenizer(d, t)
    findings = [f for f in findings if f.engine == "all" or f.engine in engines]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    return PreflightReport(target=t, draft=d, engines=engines, captures=captures, training_hf=train_hf,
                           findings=findings)
