"""The token sequences ``record train`` replays, and how they are batched.

Owns: reading sequences from a serving trace (every served sequence, prompt + generated, with its
prompt_len, rid and seq id, so the two traces align row for row) or from a prompts JSONL (token
ids, text, prompt/completion or chat messages), the optional greedy extension with the target,
and grouping sequences of similar length into padded batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.tracer.jsonl import iter_jsonl
from specdiff.tracer.store import open_trace

__all__ = ["TrainSequence", "sequences_from_trace", "sequences_from_prompts", "extend_greedy",
           "batches_by_length"]


@dataclass
class TrainSequence:
    """One sequence to replay: int tokens, how many came from the prompt, request id, seq id."""

    tokens: np.ndarray
    prompt_len: int
    rid: str | None = None
    seq_id: int | None = None


def sequences_from_trace(path: str) -> tuple[list[TrainSequence], dict]:
    """Every sequence of a (serving) trace, with its prompt_len, rid and seq id; and its contract.

    Sequences with fewer than 2 tokens have no draft row and are left out; the returned
    contract then holds ``skipped_sequences`` (their seq ids) so the caller can say so."""
    trace = open_trace(path)
    seqs = [TrainSequence(np.asarray(s.tokens, np.int64), int(s.prompt_len), s.rid, int(s.id))
            for s in trace.sequences if len(s.tokens) >= 2]
    contract = dict(trace.contract)
    seqs += _crashed_requests(contract.get("crash"), seqs, contract)
    if not seqs:
        died = ("" if trace.closed or isinstance(contract.get("crash"), dict) else
                ": it was never closed and records no crash (its server ended before it wrote a request); record "
                "the training side from the prompts that were sent (record train --prompts FILE)")
        raise RecordTrainError(f"{path}: the trace holds no token sequences to replay{died}")
    skipped = [int(s.id) for s in trace.sequences if len(s.tokens) < 2]
    if skipped:
        contract["skipped_sequences"] = skipped
    return seqs, contract


def _crashed_requests(crash, seqs: list[TrainSequence], contract: dict) -> list[TrainSequence]:
    """The requests a server crashed on (contract ``crash``, tracer/crash.py): their sequences
    are replayed as recorded (the prompt, and any token committed before the crash); a request
    whose ids only the crash record holds (no sequence written before the process died) is added
    here, prompt only. Sets ``contract["crash_replay"]``: one line saying what is replayed."""
    from specdiff.tracer.crash import UNKNOWN_IDS

    if not isinstance(crash, dict):
        return []
    by_rid = {s.rid: s for s in seqs}
    added, said = [], []
    for req in crash.get("requests") or [{"rid": r, "input_ids": UNKNOWN_IDS} for r in crash.get("rids") or []]:
        rid, ids = str(req.get("rid")), req.get("input_ids")
        if rid in by_rid:
            s = by_rid[rid]
            extra = len(s.tokens) - s.prompt_len
            said.append(f"request {rid} ({s.prompt_len} prompt tokens" + (f" + {extra} generated" if extra else "")
                        + ", from the trace's sequence)")
        elif isinstance(ids, list) and len(ids) >= 2:
            added.append(TrainSequence(np.asarray(ids, np.int64), len(ids), rid, None))
            said.append(f"request {rid} ({len(ids)} prompt tokens, from the crash record)")
        else:
            said.append(f"request {rid} (its token ids are unknown: not replayed)")
    if said:
        contract["crash_replay"] = (f"serving crashed on {', '.join(said)}; replayed prompt only, so `specdiff "
                                    "diff` reports the crash where serving stopped")
    return added


def _load_tokenizer(target_dir: Path):
    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                      "tokenizer.model")):
        raise RecordTrainError(f"{target_dir}: no tokenizer files; give token ids in the prompts file "
                               "(\"input_ids\": [...])")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    except Exception as e:
        raise RecordTrainError(f"cannot load the tokenizer of {target_dir}: {type(e).__name__}: {e}") from None


def sequences_from_prompts(path: str | Path, target_dir: str | Path, *,
                           defaults_used: dict | None = None) -> list[TrainSequence]:
    """Sequences from a JSONL file, one object per line, any of:

    - ``{"input_ids": [...]}`` or ``{"tokens": [...]}`` (token ids; optional ``"prompt_len"``);
    - ``{"text": "..."}`` (tokenized with the target's tokenizer, special tokens added);
    - ``{"prompt": "...", "completion": "..."}`` (completion optional; prompt_len = prompt tokens);
    - ``{"messages": [...]}`` (the tokenizer's chat template).

    An optional ``"rid"`` names the sample. Raises RecordTrainError naming the line.

    How text becomes tokens is a choice made here, not by the file: when ``defaults_used`` is a
    dict, the choices used are added to it (``text_special_tokens``, ``chat_generation_prompt``).
    """
    path = Path(path)
    if not path.is_file():
        raise RecordTrainError(f"{path}: no such prompts file")
    tok = None
    out: list[TrainSequence] = []
    for n, obj in iter_jsonl(path, error=RecordTrainError):
        if not isinstance(obj, dict):
            raise RecordTrainError(f"{path}:{n}: expected a JSON object per line")
        rid = str(obj.get("rid", obj.get("id", f"prompt-{len(out)}")))
        ids_key = "input_ids" if "input_ids" in obj else "tokens" if "tokens" in obj else None
        if ids_key:
            ids = obj[ids_key]
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise RecordTrainError(f"{path}:{n}: {ids_key} must be a list of ints")
            plen = obj.get("prompt_len", len(ids))
            if not isinstance(plen, int) or not 0 <= plen <= len(ids):
                raise RecordTrainError(f"{path}:{n}: prompt_len {plen!r} is not an int in 0..{len(ids)} "
                                       "(the number of tokens that came from the prompt)")
        else:
            if tok is None:
                tok = _load_tokenizer(Path(target_dir))
            if "messages" in obj:
                try:
                    ids = list(tok.apply_chat_template(obj["messages"], tokenize=True))
                    _note_default(defaults_used, "chat_generation_prompt", False,
                                  "record train default: messages go through the tokenizer's chat template "
                                  "without a generation prompt (add_generation_prompt=False)")
                except Exception as e:
                    raise RecordTrainError(f"{path}:{n}: chat template failed: {e}") from None
                if ids and isinstance(ids[0], list):
                    ids = ids[0]
                plen = len(ids)
            elif "prompt" in obj or "text" in obj:
                prompt = obj.get("prompt", obj.get("text"))
                ids = tok(prompt, add_special_tokens=True)["input_ids"]
                _note_default(defaults_used, "text_special_tokens", True,
                              "record train default: text prompts are tokenized with the tokenizer's special "
                              "tokens (BOS), a completion without")
                plen = len(ids)
                if obj.get("completion"):
                    ids = ids + tok(obj["completion"], add_special_tokens=False)["input_ids"]
            else:
                raise RecordTrainError(f"{path}:{n}: needs one of input_ids, tokens, text, prompt, messages")
        if len(ids) < 2:
            raise RecordTrainError(f"{path}:{n}: a sequence needs at least 2 tokens, got {len(ids)}")
        out.append(TrainSequence(np.asarray(ids, np.int64), plen, rid, None))
    if not out:
        raise RecordTrainError(f"{path}: no prompts")
    return out


def _note_default(defaults_used: dict | None, name: str, value, source: str) -> None:
    if defaults_used is not None:
        defaults_used.setdefault(name, {"value": value, "source": source})


@torch.no_grad()
def extend_greedy(target, seqs: list[TrainSequence], max_new_tokens: int) -> list[TrainSequence]:
    """Append the target's greedy continuation (``max_new_tokens``) to each sequence."""
    from specdiff.replay.model.target_capture import greedy_generate

    dev = next(target.parameters()).device
    out = []
    for s in seqs:
        ids = torch.as_tensor(s.tokens, dtype=torch.int64, device=dev)[None]
        gen = greedy_generate(target, ids, max_new_tokens)[0].cpu().numpy()
        out.append(TrainSequence(np.concatenate([s.tokens, gen]), s.prompt_len, s.rid, s.seq_id))
    return out


def batches_by_length(seqs: list[TrainSequence], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Indices grouped by similar length (longest first), at most ``batch_size`` sequences and
    about ``max_tokens`` padded tokens per batch."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].tokens))
    out, cur = [], []
    for i in order:
        longest = len(seqs[cur[0]].tokens) if cur else len(seqs[i].tokens)
        if cur and (len(cur) >= batch_size or longest * (len(cur) + 1) > max_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out
