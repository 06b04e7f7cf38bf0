"""Token format: read the target tokenizer a trace names, and say how two token formats differ.

Used by explain (the ``tokens`` divergence of sequences that paired only by content: a BOS added
or dropped, a chat template's role markers, a space-prefixed first token, a template suffix), by
the alignment error (the nearest pair's first tokens, decoded) and by the app (decoded previews).
"""

from __future__ import annotations

import json
from pathlib import Path

from specdiff.replay.diff.types import Pair, SeqPair
from specdiff.tracer.paths import contract_path


def _tokenizer_file(path: Path) -> Path:
    return path if path.name.endswith(".json") else path / "tokenizer.json"


def tokenizer_dir(traces) -> Path | None:
    """The first contract ``model_name`` (either side) that is a local dir with a tokenizer.json (a
    relative one found from the trace's folders, ``tracer.paths.contract_path``)."""
    for trace in (traces.x, traces.y):
        found = contract_path(trace, "model_name", want=lambda p: _tokenizer_file(p).is_file())
        if found.path is not None:
            return _tokenizer_file(found.path).parent
    return None


def load_tokenizer(traces):
    """``tokenizers.Tokenizer`` of the target a contract names (``model_name``), else None.

    A broken or missing tokenizer only costs the decoded text, so every failure returns None.
    """
    d = tokenizer_dir(traces)
    if d is None:
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(d / "tokenizer.json"))
    except Exception:  # noqa: BLE001
        return None


def special_ids(traces) -> dict[str, int]:
    """``{"bos": id, "eos": id, ...}`` from the tokenizer_config.json next to the tokenizer (may be empty)."""
    d = tokenizer_dir(traces)
    tok = load_tokenizer(traces)
    if d is None or tok is None:
        return {}
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for key in ("bos", "eos", "pad"):
        t = cfg.get(f"{key}_token")
        t = t.get("content") if isinstance(t, dict) else t
        if isinstance(t, str) and tok.token_to_id(t) is not None:
            out[key] = int(tok.token_to_id(t))
    return out


def decoder(tokenizer):
    """``ids -> str`` (special tokens kept), or None without a tokenizer."""
    if tokenizer is None:
        return None

    def decode(ids) -> str | None:
        try:
            return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        except Exception:  # noqa: BLE001
            return None
    return decode


def _show(ids: tuple[int, ...], decode) -> str:
    if not ids:
        return "(nothing)"
    text = decode(ids) if decode else None
    return f"{list(ids)}" + (f" = {text!r}" if text is not None else "")


def describe(pair: SeqPair, labels: Pair, *, decode=None, specials: dict | None = None) -> tuple[list[str], list[str]]:
    """(differences in words, decoded side-by-side lines) of one content-paired sequence pair.

    Differences named: BOS on one side only, text before the common part (role markers / a
    template prefix), a space-prefixed first token, text after the common part (a template suffix).
    """
    f = pair.format
    specials = specials or {}
    bos = specials.get("bos")
    hx, hy = f.head.x, f.head.y
    words: list[str] = []
    if bos is not None:
        bx, by = bool(hx) and hx[0] == bos, bool(hy) and hy[0] == bos
        if bx != by:
            words.append(f"BOS (id {bos}) added on {labels.x if bx else labels.y} only")
        hx, hy = (hx[1:] if bx else hx), (hy[1:] if by else hy)
    tx = decode(hx) if decode and hx else ""
    ty = decode(hy) if decode and hy else ""
    if hx or hy:
        nested = decode and tx is not None and ty is not None and tx and ty and (tx.endswith(ty) or ty.endswith(tx))
        if nested:
            # One head ends with the other's text: the longer one adds a prefix, and the shared word
            # was tokenized with a leading space on that side (BPE 'Ġdef' vs 'def').
            (short, ls), (long_, ll) = sorted([(tx, labels.x), (ty, labels.y)], key=lambda v: len(v[0]))
            extra = long_[: len(long_) - len(short)]
            if extra.endswith(" ") and not short.startswith(" "):
                words.append(f"a space-prefixed first token on {ll} ({' ' + short!r} vs {short!r} on {ls})")
            if extra.strip():
                words.append(f"{ll} has text before the common part (role markers / a chat template prefix: "
                             f"{extra.strip()!r})")
        elif hx and hy:
            words.append(f"different text before the common part ({labels.x} {tx!r}, {labels.y} {ty!r})"
                         if decode else "different tokens before the common part")
        else:
            side, text = (labels.x, tx) if hx else (labels.y, ty)
            words.append(f"{side} has text before the common part (role markers / a chat template prefix"
                         + (f": {text!r}" if decode else "") + ")")
    if f.tail.x and f.tail.y and decode:
        words.append(f"after the common part {labels.x} continues {decode(f.tail.x)!r}, "
                     f"{labels.y} {decode(f.tail.y)!r} (a template suffix or another continuation)")
    side_by_side = [
        f"{labels.x:>9s} before the common part: {_show(f.head.x, decode)}",
        f"{labels.y:>9s} before the common part: {_show(f.head.y, decode)}",
        f"{'':>9s} common part: {f.run} tokens, at {labels.x} token {pair.start.x} / {labels.y} token {pair.start.y}",
        f"{labels.x:>9s} after it: {_show(f.tail.x, decode)}",
        f"{labels.y:>9s} after it: {_show(f.tail.y, decode)}",
    ]
    return words, side_by_side
