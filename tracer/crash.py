"""The crash record: what a server's exception leaves in its trace (contract field ``crash``).

When the scheduler raises inside a recorded iteration, the recorder writes one msgpack/JSON-safe
dict into the contract and closes the trace before the process dies:

    {"type": "RuntimeError", "message": "mat1 and mat2 shapes cannot be multiplied (7x512 and 768x256)",
     "forward": "draft extend (prefill)", "iter": 0, "kind": "prefill", "rids": [...],
     "forward_shapes": {"input_ids": [7], "positions": [7]},
     "shapes": {"Linear.forward: input": [7, 512], "Linear.forward: self.weight": [256, 768], ...},
     "where": ["llama_eagle3.py:247 forward", "linear.py:134 forward", ...],
     "engine_where": "srt/models/llama_eagle3.py:247 forward: hidden_states = self.fc(hidden_states)",
     "requests": [{"rid": "0a1b...", "input_ids": [1, 22, 333, ...]}]}

``forward`` names the forward that was running (the recorder tracks it around every
``ModelRunner.forward``): target prefill, target verify, draft extend (prefill), draft extend
(decode), draft decode; outside any model forward (e.g. verify's sampling), the innermost SGLang
function: ``eagle_sample (eagle_utils.py:560), outside the model forwards``. ``shapes`` are the tensor locals (and module weights) of the innermost frames.
``engine_where`` is the innermost frame in the engine's own package (path from the package root and
its source line), the line a user opens. ``requests`` are the requests of the iteration that raised,
each with the token ids the recorder read for it in that iteration (its prompt, at prefill) or
``"unknown"`` when none were read there (a decode iteration: the trace's sequence of that rid holds
them); ``record train --replay`` replays them, ``diff`` names them.
"""

from __future__ import annotations

import os

from specdiff.eagle3.engines import ENGINES

#: ForwardMode name -> the forward's name in a crash record (SGLang 0.5.23 forward_batch_info.py:198).
TARGET_FORWARDS = {"EXTEND": "target prefill", "TARGET_VERIFY": "target verify", "DECODE": "target decode"}
DRAFT_FORWARDS = {"EXTEND": "draft extend (prefill)", "DRAFT_EXTEND_V2": "draft extend (decode)",
                  "DECODE": "draft decode"}
_MAX_MESSAGE = 2000
_SHAPE_FRAMES = 3
_MAX_SHAPES = 16
#: specdiff's own recorder code: its SGLang recorder lives in a folder named ``sglang`` too
#: (tracer/engines/sglang/), and its wrappers are never where serving failed
_OWN_CODE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def forward_name(*, is_draft: bool, mode: str | None) -> str:
    """Name of a model forward from its runner (draft or target) and ForwardMode name."""
    table = DRAFT_FORWARDS if is_draft else TARGET_FORWARDS
    side = "draft" if is_draft else "target"
    return table.get(mode or "", f"{side} forward ({(mode or 'unknown mode').lower()})")


def _shape(v) -> list[int] | None:
    shape = getattr(v, "shape", None)
    if shape is None or not hasattr(v, "dtype"):
        return None
    try:
        return [int(d) for d in shape]
    except (TypeError, ValueError):
        return None


def _frames(exc: BaseException) -> list:
    out, tb = [], exc.__traceback__
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _frame_shapes(frames) -> dict[str, list[int]]:
    """Tensor locals (and a module ``self``'s weight) of the innermost frames, innermost first."""
    shapes: dict[str, list[int]] = {}
    for frame, _ in reversed(frames[-_SHAPE_FRAMES:]):
        owner = frame.f_locals.get("self")
        fn = f"{type(owner).__name__}.{frame.f_code.co_name}" if owner is not None else frame.f_code.co_name
        for name, v in list(frame.f_locals.items()):
            s = _shape(v)
            if s is not None:
                shapes[f"{fn}: {name}"] = s
        w = _shape(getattr(owner, "__dict__", {}).get("_parameters", {}).get("weight")) if owner is not None else None
        if w is not None:
            shapes[f"{fn}: self.weight"] = w
        if len(shapes) >= _MAX_SHAPES:
            break
    return dict(list(shapes.items())[:_MAX_SHAPES])


#: ``requests[i]["input_ids"]`` when the iteration that raised read no ids for that request
UNKNOWN_IDS = "unknown"


def crash_requests(rids, prompts: dict | None) -> list[dict]:
    """The ``requests`` of a crash record: one ``{"rid", "input_ids"}`` per request of the iteration.

    Args:
        rids: the iteration's request ids, in batch order.
        prompts: rid -> prompt token ids the recorder read in this iteration (``IterCapture.prompts``
            of either recorder; an empty list = the engine's field could not be read). A rid
            absent from it was first seen in an earlier iteration.
    Returns:
        ``input_ids`` a list of ints, or ``UNKNOWN_IDS`` where none were read.
    """
    # lazily: tracer.rows imports torch, which `specdiff diff` never loads
    from specdiff.tracer.rows import token_list

    prompts = prompts or {}
    ids = {r: token_list(prompts.get(r)) for r in rids}  # a list, array.array, numpy array or tensor
    return [{"rid": str(r), "input_ids": ids[r] or UNKNOWN_IDS} for r in rids]


def _engine_where(frames) -> str | None:
    """``srt/models/llama_eagle3.py:247 forward: <source line>`` of the innermost engine frame."""
    import linecache

    for f, line in reversed(frames):
        path = os.path.abspath(f.f_code.co_filename)
        if path.startswith(_OWN_CODE):
            continue
        parts = path.split(os.sep)
        for pkg in ENGINES:  # an engine's name is its Python package's
            if pkg in parts[:-1]:
                top = max(i for i, p in enumerate(parts[:-1]) if p == pkg)
                rel = "/".join(parts[top + 1:])
                src = linecache.getline(f.f_code.co_filename, line).strip()
                return f"{rel}:{line} {f.f_code.co_name}" + (f": {src}" if src else "")
    return None


def crash_record(exc: BaseException, *, forward: str | None, forward_shapes: dict | None = None,
                 iteration: int | None = None, kind: str | None = None, rids=(),
                 prompts: dict | None = None) -> dict:
    """The ``crash`` contract fact for ``exc`` (see the module docstring).

    Args:
        exc: the exception, with its traceback.
        forward: the model forward that was running, or None (then the innermost function's name).
        forward_shapes: shapes of that forward's inputs (name -> list of ints).
        iteration, kind, rids: the recorded iteration it happened in ("prefill" / "decode").
        prompts: rid -> the prompt ids read in that iteration (``crash_requests``).
    """
    frames = _frames(exc)
    where = [f"{os.path.basename(f.f_code.co_filename)}:{line} {f.f_code.co_name}" for f, line in frames[-8:]]
    if forward is None:
        # the innermost SGLang function (torch's own frames say less about where in serving)
        sg = [(f, line) for f, line in frames if f"{os.sep}sglang{os.sep}" in f.f_code.co_filename
              and not os.path.abspath(f.f_code.co_filename).startswith(_OWN_CODE)]
        f, line = (sg or frames or [(None, 0)])[-1]
        forward = ("unknown" if f is None else
                   f"{f.f_code.co_name} ({os.path.basename(f.f_code.co_filename)}:{line}), outside the model forwards")
    return {"type": type(exc).__name__, "message": str(exc)[:_MAX_MESSAGE], "forward": forward,
            "iter": iteration, "kind": kind, "rids": [str(r) for r in rids],
            "forward_shapes": dict(forward_shapes or {}), "shapes": _frame_shapes(frames), "where": where,
            "engine_where": _engine_where(frames), "requests": crash_requests(rids, prompts)}


def describe_crash(crash: dict) -> str:
    """One line: ``RuntimeError in draft extend (prefill) (iteration 0): mat1 and mat2 ...``."""
    it = crash.get("iter")
    at = f" (iteration {it})" if it is not None else ""
    msg = str(crash.get("message", "")).splitlines()[0] if crash.get("message") else ""
    return f"{crash.get('type', 'exception')} in {crash.get('forward', 'unknown')}{at}: {msg}"
