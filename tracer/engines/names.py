"""The names-table machinery every engine recorder uses: declare each private engine name once,
check it against the running engine, and turn a missing one into ``unknown`` facts, never guesses.

An engine recorder reads the engine's private objects (hook targets, private methods, dataclass
fields, attributes set in ``__init__``, function parameters). A rename in a new release must not
become silently missing rows or a contract fact filled in from elsewhere. So each engine package
declares a table of ``EngineName`` (tracer/engines/sglang/adapter.py ``NAMES``,
tracer/engines/vllm/adapter.py ``NAMES``) and subclasses ``EngineAdapter``, which:

- resolves every class / function / method / field / parameter name by import + ``hasattr``
  (``check_names``); instance attributes are checked on the live object (``check_instance``);
- logs a missing name ONCE: ``specdiff: <Title> <version> has no <name> (<source>; <why>): now
  unobservable: tensors ...; contract facts ...``;
- reads through ``get`` (never ``getattr(x, name, None)``): an absent attribute is ``MISSING``
  (logged, marked), a present attribute that is None stays None;
- lists what went missing for the contract's ``unobservable`` field, one entry per name:
  ``{name, <engine>: dotted path, source, tensors, facts, why, <engine>_version}`` where
  ``<engine>`` is the trace's ``engine`` fact ('sglang', 'vllm'): tracer/contract.py
  ``unobservable_engine`` reads either back.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import pkgutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from specdiff.eagle3.engines import EngineSpec
from specdiff.tracer.contract import UNKNOWN

logger = logging.getLogger("specdiff.tracer")


class _Missing:
    """Sentinel: the attribute does not exist on the object (not the same as a None value)."""

    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING = _Missing()

# Kinds of name and how each is checked:
#   hook      a HookRegistry target "<module>.<Class>.<method>" or "<module>.<function>": import + hasattr
#   method    a method/property/class attribute read (not hooked): import + hasattr
#   field     a dataclass field (maybe without default): import + dataclass fields / annotations
#   instance  an attribute set in __init__: checked on the live object where first seen
#   param     a parameter of a function whose frame / call the recorder reads: inspect.signature
KINDS = ("hook", "method", "field", "instance", "param")


@dataclass(frozen=True)
class EngineName:
    """One engine name the recorder depends on.

    Attributes:
        key: handle the recorder uses, ``"<Owner>.<attr>"`` (e.g. ``"EagleDraftWorker.hot_token_id"``).
        owner: dotted import path of the class / module / function that holds ``attr``.
        attr: the attribute, method, field or parameter name.
        kind: one of ``KINDS``.
        source: where the engine defines it (path under its site-packages folder, with line).
        used_for: what the recorder does with it.
        tensors: canonical tensors (tracer/schema.py) the recorder cannot record without it.
        facts: contract fields (tracer/contract.py) it cannot read without it.
        hook: for ``kind == "hook"``: (HookType name, hook function in plugin).
        essential: without it nothing can be recorded (tracing is refused).
        optional: only checked when asked for (SGLang: SPECDIFF_EAGER_DRAFT; vLLM: the V2 runner's names).
    """

    key: str
    owner: str
    attr: str
    kind: str
    source: str
    used_for: str
    tensors: tuple[str, ...] = ()
    facts: tuple[str, ...] = ()
    hook: tuple[str, str] | None = None
    essential: bool = False
    optional: bool = False

    @property
    def target(self) -> str:
        """Dotted path of the name itself (the HookRegistry target for hooks)."""
        return f"{self.owner}.{self.attr}"

    def unobservable(self, engine: str) -> dict:
        """The contract's ``unobservable`` entry for this name, ``engine`` being the trace's
        ``engine`` fact ('sglang'): the dotted path goes under that key (msgpack/JSON-safe)."""
        return {"name": self.key, engine: self.target, "source": self.source,
                "tensors": list(self.tensors), "facts": list(self.facts)}


def version_in_range(version: str, rng: tuple[str, str]) -> bool | None:
    """True when ``version`` (its release part: 0.5.23.post1 counts as 0.5.23) lies in the inclusive
    range ``rng`` = (low, high), False outside, None when it does not parse."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(Version(version).base_version)
        return Version(rng[0]) <= v <= Version(rng[1])
    except InvalidVersion:
        return None


def resolve_static(name: EngineName, resolve: Callable[[str], object]) -> str | None:
    """None when ``name`` resolves in the running engine, else why not (one short phrase).
    Instance attributes always pass here (they are checked on the live object)."""
    try:
        owner = resolve(name.owner)
    except Exception as exc:  # noqa: BLE001 - any import failure means the name is not there
        return f"cannot import {name.owner} ({type(exc).__name__}: {exc})"
    if name.kind in ("hook", "method"):
        return None if hasattr(owner, name.attr) else f"{name.owner} has no attribute {name.attr!r}"
    if name.kind == "field":
        if hasattr(owner, name.attr):
            return None
        fields = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else set()
        for klass in getattr(owner, "__mro__", ()):
            fields |= set(getattr(klass, "__annotations__", {}) or {})
        return None if name.attr in fields else f"{name.owner} has no field {name.attr!r}"
    if name.kind == "param":
        try:
            params = inspect.signature(owner).parameters
        except (TypeError, ValueError) as exc:
            return f"no signature for {name.owner} ({exc})"
        return None if name.attr in params else f"{name.owner}() has no parameter {name.attr!r}"
    return None


class EngineAdapter:
    """The recorder's view of a running engine: name checks, accessors, what became unobservable.

    Subclasses set ``spec`` (their engine's ``specdiff.eagle3.engines.EngineSpec``: ``engine`` is its
    name, the ``engine`` contract fact, ``title`` how messages name it, ``tested_range`` its verified
    versions) and pass their table as ``names``. One per engine process that records.
    Thread-safe (the writer thread may read ``unobservable``).

    Args:
        version: the running engine's ``__version__`` ("?" when unreadable).
        names: the declared ``EngineName`` table.
        log: where the one-line warnings go (default the ``specdiff.tracer`` logger's warning).
    """

    spec: EngineSpec | None = None

    @property
    def engine(self) -> str:
        return self.spec.name if self.spec else "?"

    @property
    def title(self) -> str:
        return self.spec.title if self.spec else "the engine"

    @property
    def tested_range(self) -> tuple[str, str]:
        return self.spec.tested_range if self.spec else ("0", "0")

    @classmethod
    def for_running(cls, **kw):
        """Adapter with the installed engine's ``__version__`` (the module named ``spec.name``; "?"
        when it has none or is unreadable: the names are still checked one by one)."""
        import importlib

        try:
            version = str(importlib.import_module(cls.spec.name).__version__)
        except Exception:  # noqa: BLE001 - an engine without a version is still checked name by name
            version = "?"
        return cls(version, **kw)

    def __init__(self, version: str, *, names: Iterable[EngineName], log: Callable[[str], None] | None = None):
        self.version = str(version)
        self.names = tuple(names)
        self.by_key = {n.key: n for n in self.names}
        self.missing: dict[str, str] = {}  # key -> why
        self._log = log or logger.warning
        self._lock = threading.Lock()
        self._checked_instances: set[tuple[int, str]] = set()
        self._warned: set[str] = set()

    # -- checks -------------------------------------------------------------------------------
    def check_version(self, rng: tuple[str, str] | None = None) -> bool:
        """Warn once when the running engine is outside ``rng`` (default ``tested_range``); True
        when inside (quiet)."""
        rng = self.tested_range if rng is None else rng
        ok = version_in_range(self.version, rng) if self.version != "?" else None
        if ok:
            return True
        self._log(f"specdiff: {self.title} {self.version} is outside the tested range {rng[0]}..{rng[1]}; "
                  f"every {self.title} name the recorder uses is checked, and what it cannot read is recorded "
                  "as unknown")
        return False

    def check_names(self, wanted: Callable[[EngineName], bool], *,
                    resolve: Callable[[str], object] = pkgutil.resolve_name) -> list[EngineName]:
        """Resolve every non-instance name for which ``wanted(name)`` is true; returns the missing
        ones (each logged once)."""
        bad = []
        for n in self.names:
            if n.kind == "instance" or not wanted(n):
                continue
            why = resolve_static(n, resolve)
            if why is not None:
                self.mark_missing(n.key, why)
                bad.append(n)
        return bad

    def check_instance(self, obj, *keys: str) -> list[str]:
        """Check instance attributes ``keys`` on the live ``obj`` (once per object and key);
        returns the missing keys (each logged once)."""
        bad = []
        for key in keys:
            n = self.by_key[key]
            tag = (id(obj), key)
            if tag in self._checked_instances:
                if key in self.missing:
                    bad.append(key)
                continue
            self._checked_instances.add(tag)
            if not hasattr(obj, n.attr):
                self.mark_missing(key, f"{type(obj).__name__} object has no attribute {n.attr!r}")
                bad.append(key)
        return bad

    def mark_missing(self, key: str, why: str) -> None:
        """Record ``key`` as missing and log its one line (only the first time)."""
        n = self.by_key[key]
        with self._lock:
            if key in self.missing:
                return
            self.missing[key] = why
        what = []
        if n.tensors:
            what.append("tensors " + ", ".join(n.tensors))
        if n.facts:
            what.append("contract facts " + ", ".join(n.facts))
        self._log(f"specdiff: {self.title} {self.version} has no {n.key} ({n.source}; {why}): now unobservable: "
                  f"{'; '.join(what) or 'nothing recorded depends on it'}")

    def warn_once(self, tag: str, line: str) -> None:
        """Log ``line`` the first time ``tag`` is seen (a fact assumed, not a missing name)."""
        with self._lock:
            if tag in self._warned:
                return
            self._warned.add(tag)
        self._log(line)

    # -- accessors ----------------------------------------------------------------------------
    def get(self, obj, key: str):
        """``obj.<attr of key>``, or ``MISSING`` (logged once, marked unobservable) when absent.

        A present attribute whose value is None is returned as None: None is a fact (e.g. no
        d2t), absence is not.
        """
        n = self.by_key[key]
        try:
            return getattr(obj, n.attr)
        except AttributeError:
            self.mark_missing(key, f"{type(obj).__name__} object has no attribute {n.attr!r}")
            return MISSING

    def fact(self, obj, key: str, convert: Callable = lambda v: v):
        """``convert(obj.<attr>)`` for a contract fact, or ``UNKNOWN`` when the attribute is absent."""
        v = self.get(obj, key)
        return UNKNOWN if v is MISSING else convert(v)

    def has(self, key: str) -> bool:
        """False once ``key`` was found missing."""
        return key not in self.missing

    # -- what the contract says -----------------------------------------------------------------
    def unobservable(self) -> list[dict]:
        """The contract's ``unobservable`` list: one entry per missing name (declaration order),
        ``{name, <engine>, source, tensors, facts, why, <engine>_version}``."""
        with self._lock:
            missing = dict(self.missing)
        return [dict(n.unobservable(self.engine), why=missing[n.key], **{f"{self.engine}_version": self.version})
                for n in self.names if n.key in missing]


__all__ = ["KINDS", "MISSING", "EngineAdapter", "EngineName", "resolve_static", "version_in_range"]
