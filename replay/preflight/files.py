"""Reading the model files a pre-flight check needs, never the target's weights.

Owns: the target's config.json (dims, rope, eos ids) and tokenizer hashes; the draft's
config.json (format detected, parsed by ``replay.model.draft_config``), its tensor shapes and dtypes
(safetensors headers, through ``weight_files.read_weight_headers``, the one weights reader) and its
``d2t`` / ``t2d`` (numpy: the pre-flight imports no torch for a safetensors draft); ``PreflightError``
for a directory that cannot be checked at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdiff.eagle3.aux_layers import target_architecture
from specdiff.replay.model.draft_config import (
    CheckpointError,
    detect_format,
    draft_config_from_dict,
    rope_params,
)
from specdiff.replay.model.weight_files import read_weight_headers
from specdiff.tracer.contract import tokenizer_hashes
from specdiff.tracer.errors import SpecdiffError

__all__ = ["PreflightError", "TargetInfo", "DraftInfo", "read_target", "read_draft"]


class PreflightError(SpecdiffError):
    """Input that cannot be checked at all (no config.json, unreadable weights, not a model)."""


@dataclass
class TargetInfo:
    """What the target's config.json and tokenizer files say (dims, rope, eos ids, sha256s).

    ``architecture``: HF ``architectures[0]`` (else the nested ``text_config``'s; None when
    neither names one): SGLang's aux-id rule depends on it (``eagle3.families.sglang_family_rule``).
    """

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
    architecture: str | None = None


@dataclass
class DraftInfo:
    """What the draft directory holds: raw config, detected format (None: not EAGLE-3), parsed
    config, ``tensors`` {file name: (shape, dtype)} from the headers, ``d2t`` / ``t2d`` numpy arrays."""

    path: str
    raw: dict
    format: str | None  # None: not an EAGLE-3 checkpoint
    config: object | None  # Eagle3DraftConfig
    notes: list[str]
    tensors: dict[str, tuple[tuple[int, ...], str]]  # file name -> (shape, dtype)
    d2t: np.ndarray | None
    t2d: np.ndarray | None
    tokenizer_sha256: str | None
    chat_template_sha256: str | None


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


def read_target(path) -> TargetInfo:
    """The target's architecture, dims, rope, eos ids and tokenizer hashes from config.json
    (dims from the nested ``text_config`` of a wrapper such as Kimi-K2.5) and tokenizer files."""
    p = _model_dir(path, "target")
    raw = _load_json(p / "config.json", "target config")
    d = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if not isinstance(d.get(k), int)]
    if missing:
        raise PreflightError(f"target {p}: config.json lacks {', '.join(missing)} (not a decoder model config)")
    theta, scaling = rope_params(d)
    eos = d.get("eos_token_id", raw.get("eos_token_id"))
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int))
    tok_sha, tmpl_sha = tokenizer_hashes(p)
    return TargetInfo(path=str(p), config=raw, num_layers=d["num_hidden_layers"], hidden_size=d["hidden_size"],
                      vocab_size=d["vocab_size"], rope_theta=theta, rope_scaling=scaling,
                      max_position_embeddings=d.get("max_position_embeddings"), eos_token_ids=eos_ids,
                      tokenizer_sha256=tok_sha, chat_template_sha256=tmpl_sha,
                      architecture=target_architecture(raw))


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
    try:
        tensors, vocab_map = read_weight_headers(p)
    except CheckpointError as e:
        raise PreflightError(str(e)) from None
    d2t, t2d = vocab_map.get("d2t"), vocab_map.get("t2d")
    try:
        fmt = detect_format(raw)
    except CheckpointError:
        fmt = None
    cfg, notes = (None, [])
    if fmt is not None:
        try:
            cfg, notes = draft_config_from_dict(raw, fmt, source=str(p / "config.json"))
        except CheckpointError as e:
            raise PreflightError(f"draft {p}: {e}") from None
    tok_sha, tmpl_sha = tokenizer_hashes(p)
    return DraftInfo(path=str(p), raw=raw, format=fmt, config=cfg, notes=notes, tensors=tensors,
                     d2t=d2t, t2d=t2d, tokenizer_sha256=tok_sha, chat_template_sha256=tmpl_sha)

