"""Write a ``FixPlan`` (plan.py) as a copy of the served draft directory, and say what changed.

The copy is made beside OUT and renamed into place only when complete (whole or not at all); symlinks
in the served directory are followed (the copy holds the data, so writing it never writes through a
link into the user's files). Tensors are written with the safetensors library into the file that held
them (a new tensor: the file holding ``fc.weight``, else the first), keeping the file's metadata; a
sharded checkpoint's ``model.safetensors.index.json`` gets the new names.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from specdiff.eagle3.config_keys import set_config_value
from specdiff.replay.fix.plan import FixPlan, NoMechanicalFix
from specdiff.tracer.errors import SpecdiffError

__all__ = ["FIX_FORMAT", "check_out", "write_fix", "change_json", "change_text"]

#: ``specdiff fix --format json``'s version, raised when a key is removed or changes meaning
FIX_FORMAT = 1
_INDEX = "model.safetensors.index.json"


def check_out(out: Path, source: Path, *, overwrite: bool) -> None:
    """Refuse an OUT that exists (unless ``overwrite``) or that is, holds or lies inside the served
    draft ``source`` (never written in place, ``--overwrite`` or not).

    Raises:
        SpecdiffError: one line saying which.
    """
    o, s = out.resolve(), source.resolve()
    if o == s or s in o.parents or o in s.parents:
        raise SpecdiffError(f"-o {out}: that is the served draft {source} or a folder around it; fix never edits "
                            "the user's files in place: give a new folder")
    if out.exists() and not overwrite:
        raise SpecdiffError(f"-o {out} exists; give a new folder or --overwrite")


def write_fix(plan: FixPlan, out: Path, *, overwrite: bool = False) -> Path:
    """Copy ``plan.source`` to ``out`` with ``plan``'s config and tensor edits; returns ``out``.

    Raises:
        SpecdiffError: ``out`` refused (``check_out``) or not writable.
        NoMechanicalFix: the served checkpoint has no safetensors file to write a tensor into.
    """
    out = Path(out)
    check_out(out, plan.source, overwrite=overwrite)
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.absolute().parent))
    try:
        work = tmp / "draft"
        shutil.copytree(plan.source, work, symlinks=False)
        if plan.config:
            cfg_path = work / "config.json"
            cfg = json.loads(cfg_path.read_text())
            for edit in plan.config:
                set_config_value(cfg, edit.key, edit.new)
            cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        if plan.tensors:
            _write_tensors(work, plan.tensors)
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    except OSError as exc:
        raise SpecdiffError(f"-o {out}: cannot write the fixed draft ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_tensors(work: Path, edits) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = sorted(work.glob("*.safetensors"))
    if not files:
        raise NoMechanicalFix(f"no mechanical fix: the served draft {work.name} holds no .safetensors file")
    held = {}
    for f in files:
        with safe_open(str(f), "pt") as h:
            held.update({k: f for k in h.keys()})
    home = held.get("fc.weight", files[0])
    touched = {held.get(e.name, home) for e in edits if e.new is not None or e.name in held}
    for f in sorted(touched):
        with safe_open(str(f), "pt") as h:
            tensors, meta = {k: h.get_tensor(k) for k in h.keys()}, h.metadata()
        for e in edits:
            if held.get(e.name, home) != f:
                continue
            if e.new is None:
                tensors.pop(e.name, None)
            else:
                tensors[e.name] = e.new.contiguous()
        save_file(tensors, str(f), metadata=meta)
    index = work / _INDEX
    if index.is_file():
        data = json.loads(index.read_text())
        wmap = data.setdefault("weight_map", {})
        for e in edits:
            if e.new is None:
                wmap.pop(e.name, None)
            else:
                wmap.setdefault(e.name, held.get(e.name, home).name)
        index.write_text(json.dumps(data, indent=2) + "\n")


def _shape(t) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def change_json(plan: FixPlan, out: Path | None) -> dict:
    """The change as JSON: ``fix_format``, the cause and tensor, the fix sentence, the served draft
    (``source``), ``out``, ``config`` [{key, old, new}], ``tensors`` [{name, change ('write' |
    'remove'), dtype, shape, why}] and the serving engine ``options`` [{flag, old, new}] (new null:
    drop the flag)."""
    return {"fix_format": FIX_FORMAT, "cause": plan.cause, "tensor": plan.tensor, "fix": plan.fix,
            "source": str(plan.source), "out": None if out is None else str(out),
            "config": [{"key": c.key, "old": c.old, "new": c.new} for c in plan.config],
            "tensors": [{"name": t.name, "change": "remove" if t.new is None else "write",
                         "dtype": None if t.new is None else str(t.new.dtype).removeprefix("torch."),
                         "shape": None if t.new is None else list(t.new.shape), "why": t.why}
                        for t in plan.tensors],
            "options": [{"flag": o.flag, "old": o.old, "new": o.new} for o in plan.options]}


def change_text(plan: FixPlan, out: Path) -> str:
    """The change as a diff of config keys and tensor names, with the cause and where it went."""
    lines = [f"fix: {plan.cause} at {plan.tensor}: {plan.fix}",
             f"wrote {out} (a copy of {plan.source}; the served draft is unchanged)"]
    if plan.config:
        lines.append("config.json")
        for c in plan.config:
            lines += [f"  - {c.key}: {json.dumps(c.old)}", f"  + {c.key}: {json.dumps(c.new)}"]
    if plan.tensors:
        lines.append("tensors")
        for t in plan.tensors:
            lines.append(f"  - {t.name}  ({t.why})" if t.new is None else f"  ~ {t.name} {_shape(t.new)}  ({t.why})")
    if plan.options:
        lines.append("server options (serve the copy with these; the draft itself is unchanged)")
        for o in plan.options:
            if o.old is not None:
                lines.append(f"  - {o.flag} {json.dumps(o.old)}")
            lines.append(f"  + {' '.join(o.argv())}" if o.new is not None else f"  (drop {o.flag})")
    return "\n".join(lines)
