"""Every engine recorder's options, read from ``SPECDIFF_*`` environment variables; a bad value is an
error that names the variable, the value and what is accepted (never a silent fallback).

The SGLang and vLLM plugins read the same variables; ``SPECDIFF_EAGER_DRAFT`` only has an effect on
SGLang (its CUDA-graphed draft steps re-run eagerly: tracer/engines/sglang/draft_stages.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from specdiff.tracer.errors import SpecdiffError


# ---- options --------------------------------------------------------------------------------
@dataclass
class Options:
    """Recorder options, read from the environment (see ``from_env``)."""

    path: str
    capture: str = "default"  # "default" | "full"
    logits_topk: int = 8
    rids: str | None = None
    eager_draft: bool = False
    max_queue_mb: int = 256  # the bound on host memory of captures in flight (the ring size)
    sample: float | None = None  # record this fraction of requests (tracer/engines/requests.py)
    writer: str = "process"  # "process": rows built in a writer process; "thread": in this one
    writer_nice: int = 19  # the writer process's niceness (tracer/engines/writer/child.py NICE; 0: the server's)
    weight_facts: bool = True  # fingerprint the checkpoints on the load path (tracer/weight_facts.py)

    @classmethod
    def from_env(cls, env) -> Options | None:
        """Options from ``SPECDIFF_*`` variables; None when ``SPECDIFF_TRACE`` is unset or empty.

        An unset or empty variable takes its default. A value that cannot be used is never
        replaced by a default: :class:`OptionError` names the variable, the value given and the
        values accepted (the plugin then refuses to trace, in one log line).
        """
        path = env.get("SPECDIFF_TRACE")
        if not path:
            return None
        return cls(path=path,
                   capture=_env_choice(env, "SPECDIFF_CAPTURE", ("default", "full"), default="default"),
                   logits_topk=_env_int(env, "SPECDIFF_LOGITS_TOPK", 8),
                   max_queue_mb=_env_int(env, "SPECDIFF_MAX_QUEUE_MB", 256),
                   rids=_env_regex(env, "SPECDIFF_RIDS"),
                   eager_draft=_env_flag(env, "SPECDIFF_EAGER_DRAFT"),
                   sample=_env_fraction(env, "SPECDIFF_SAMPLE"),
                   writer=_env_choice(env, "SPECDIFF_WRITER", ("process", "thread"), default="process"),
                   # read again by the writer process itself; checked here so a bad value is one refusal
                   writer_nice=_env_int(env, "SPECDIFF_WRITER_NICE", 19, minimum=0, maximum=19),
                   # SPECDIFF_WEIGHT_FACTS=0: no weight facts (benchmarks/contract_startup.py measures their cost)
                   weight_facts=_env_flag(env, "SPECDIFF_WEIGHT_FACTS", default=True))

    def sampler(self):
        """The ``RequestSampler`` these options ask for (``SPECDIFF_SAMPLE``, ``SPECDIFF_RIDS``)."""
        from specdiff.tracer.engines.requests import RequestSampler

        return RequestSampler(self.sample, self.rids)


class OptionError(SpecdiffError):
    """A ``SPECDIFF_*`` variable holds a value the recorder cannot use."""

    def __init__(self, name: str, raw: str, accepted: str):
        super().__init__(f"{name}={raw!r} is not valid; accepted values: {accepted}")
        self.name = name


def _given(env, name: str) -> str | None:
    raw = env.get(name)
    return None if raw is None or not raw.strip() else raw


def _env_choice(env, name: str, choices: tuple[str, ...], *, default: str) -> str:
    raw = _given(env, name)
    if raw is None:
        return default
    if raw.strip().lower() not in choices:
        raise OptionError(name, raw, " or ".join(choices))
    return raw.strip().lower()


def _env_int(env, name: str, default: int, *, minimum: int = 1, maximum: int | None = None) -> int:
    raw = _given(env, name)
    if raw is None:
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        v = None
    if v is None or v < minimum or (maximum is not None and v > maximum):
        span = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise OptionError(name, raw, f"an integer {span} (default {default})")
    return v


def _env_fraction(env, name: str) -> float | None:
    raw = _given(env, name)
    if raw is None:
        return None
    try:
        v = float(raw.strip())
    except ValueError:
        v = None
    if v is None or not 0.0 < v <= 1.0:
        raise OptionError(name, raw, "a fraction in (0, 1], e.g. 0.1 (unset: every request)")
    return None if v == 1.0 else v


def _env_regex(env, name: str) -> str | None:
    raw = _given(env, name)
    if raw is None:
        return None
    try:
        re.compile(raw)
    except re.error as exc:
        raise OptionError(name, raw, f"a Python regular expression (this one: {exc})") from None
    return raw


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env_flag(env, name: str, *, default: bool = False) -> bool:
    raw = _given(env, name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v not in _TRUE + _FALSE:
        raise OptionError(name, raw, "/".join(_TRUE) + " or " + "/".join(_FALSE))
    return v in _TRUE


