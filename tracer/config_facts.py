"""The whole effective config and options of a side, as contract facts: every key, read off the live
objects the engine or trainer built (never a list of the keys someone thought mattered).

- ``config_fact``: a model config's ``to_dict()`` (a transformers ``PretrainedConfig`` as the engine
  loaded it: defaults filled in, overrides applied), JSON-safe, every key kept;
- ``options_fact``: every field of an engine's argument object (a dataclass, a msgspec ``Struct``
  such as SGLang 0.5.23's ``ServerArgs``, or a plain object's public attributes), JSON-safe.

Values are made JSON-safe by ``json_safe``: nested configs and records as dicts, tuples as lists,
enums by name, a dtype or a device as its string, anything else by its type name (never a ``repr``
holding a memory address, which would differ between two runs of the same setting). Depth is
bounded (``MAX_DEPTH``): an engine's config objects refer to one another.
"""

from __future__ import annotations

import dataclasses
import enum
import math

#: nesting kept by ``json_safe``; deeper values are written as their type name
MAX_DEPTH = 4
#: longest list kept whole; a longer one is written as ``"<list of N>"`` (an expert map, a token list)
MAX_ITEMS = 256


def _fields(obj) -> list[str] | None:
    """Field names of a dataclass or msgspec Struct instance, None for anything else."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [f.name for f in dataclasses.fields(obj)]
    names = getattr(type(obj), "__struct_fields__", None)
    return list(names) if isinstance(names, tuple) else None


def json_safe(value, depth: int = 0):
    """``value`` as msgpack/JSON-safe data (module doc)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return str(value.name)
    if depth >= MAX_DEPTH:
        return f"<{type(value).__name__}>"
    if hasattr(value, "to_dict") and callable(value.to_dict) and not isinstance(value, type):
        try:
            value = value.to_dict()
        except Exception:  # noqa: BLE001 - a to_dict that needs arguments: read its fields instead
            pass
    if isinstance(value, dict):
        return {str(k): json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
        if len(items) > MAX_ITEMS:
            return f"<list of {len(items)}>"
        return [json_safe(v, depth + 1) for v in items]
    names = _fields(value)
    if names is not None:
        return {n: json_safe(getattr(value, n, None), depth + 1) for n in names}
    name = type(value).__name__
    if name in ("dtype", "device", "Path", "PosixPath", "WindowsPath"):
        return str(value).replace("torch.", "")
    return f"<{name}>"


def config_fact(config) -> dict:
    """Every key of a model config as built (``to_dict()``, or a mapping), JSON-safe.

    Raises:
        TypeError: ``config`` is neither a mapping nor has ``to_dict``.
    """
    if isinstance(config, dict):
        return json_safe(config)
    if not callable(getattr(config, "to_dict", None)):
        raise TypeError(f"config_fact needs a config with to_dict() or a mapping, got {type(config).__name__}")
    return json_safe(config.to_dict())


def options_fact(args, *, resolved: dict | None = None) -> dict:
    """Every field of an engine's argument object, JSON-safe: ``resolved`` (the engine's own resolved
    values, e.g. SGLang's ``ServerArgs.resolved_dict()``) when given, else the object's fields
    (dataclass / msgspec Struct), else its public attributes."""
    if resolved is not None:
        return {str(k): json_safe(v, 1) for k, v in resolved.items()}
    names = _fields(args)
    if names is None:
        names = [n for n in vars(args) if not n.startswith("_")]
    return {n: json_safe(getattr(args, n, None), 1) for n in names}


def given_options(args, defaults: dict) -> dict:
    """The fields an operator gave (their value differs from the field's default), as
    ``{field: {"value": given, "default": default}}``, JSON-safe; ``defaults``: field -> default."""
    out = {}
    for name, default in defaults.items():
        value = getattr(args, name, default)
        if json_safe(value, 1) != json_safe(default, 1):
            out[name] = {"value": json_safe(value, 1), "default": json_safe(default, 1)}
    return out


__all__ = ["MAX_DEPTH", "config_fact", "given_options", "json_safe", "options_fact"]
