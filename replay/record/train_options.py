"""What ``record train`` does with options the caller leaves unset (torch-free, so the CLI can
show the defaults in its help without importing torch).

Every value filled in from here is stored, with its source, in the training trace's contract
field ``defaults_used`` (``tracer.contract.DEFAULTS_USED``).
"""

from __future__ import annotations

from specdiff.replay.record.errors import RecordTrainError

DTYPE_NAMES = ("bfloat16", "float32", "float16")
CAPTURE_LEVELS = ("default", "full")
#: the value of each option the caller leaves unset; bf16 is the serving dtype, which keeps the
#: tolerances against a serving trace tight (DESIGN.md)
DEFAULTS = {"dtype": "bfloat16", "target_dtype": "bfloat16", "capture": "default", "probe_positions": 64,
            "max_new_tokens": 0, "batch_size": 8, "device": "cpu"}
#: steps / topk when there is no serving trace (its spec_steps / spec_topk) to take them from
FALLBACK_STEPS, FALLBACK_TOPK = 3, 1
#: --aux-convention when --aux-layers is given alone
AUX_CONVENTION_DEFAULT = "hf"
#: the ``defaults_used`` names that are command-line options
OPTIONS = frozenset(DEFAULTS) | {"steps", "topk", "aux_layers", "aux_convention"}


def fill_defaults(given: dict, served: dict) -> tuple[dict, dict[str, dict]]:
    """``given`` (option name -> value or None) with every None replaced, and the
    ``defaults_used`` entries (name -> ``{"value", "source"}``) for what was filled in.

    steps / topk come from the serving trace (``spec_steps`` / ``spec_topk``) when there is one,
    so the training side drafts as deep and as wide as serving did; else ``FALLBACK_*``.
    """
    values, used = dict(given), {}
    for name, default in DEFAULTS.items():
        if name in values and values[name] is None:
            values[name] = default
            used[name] = {"value": default, "source": "record train default"}
    for name, key, fallback in (("steps", "spec_steps", FALLBACK_STEPS), ("topk", "spec_topk", FALLBACK_TOPK)):
        if name in values and values[name] is None:
            if served.get(key) is not None:
                values[name] = int(served[key])
                used[name] = {"value": values[name], "source": f"the serving trace's {key}"}
            else:
                values[name] = fallback
                used[name] = {"value": fallback, "source": "record train default (no serving trace)"}
    return values, used


def describe_defaults(used: dict[str, dict]) -> str:
    """One line for the terminal: ``--steps 3 (the serving trace's spec_steps); --dtype bfloat16; ...``."""
    parts = []
    for name, entry in used.items():
        value = entry["value"]
        shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        src = entry["source"]
        flag = f"--{name.replace('_', '-')}" if name in OPTIONS else name  # else a choice with no option
        parts.append(f"{flag} {shown}" + ("" if src == "record train default" else f" ({src})"))
    return "; ".join(parts)


def check_counts(*, steps, topk, probe_positions, max_new_tokens, batch_size, replay) -> None:
    """Refuse option values that cannot be used as given (one line each, naming the option).

    Raises:
        RecordTrainError: the option and why.
    """
    for opt, value, low in (("--steps", steps, 1), ("--topk", topk, 1), ("--probe-positions", probe_positions, 0),
                            ("--max-new-tokens", max_new_tokens, 0), ("--batch-size", batch_size, 1)):
        if value is not None and int(value) < low:
            raise RecordTrainError(f"{opt} {value}: must be >= {low}")
    if replay is not None and max_new_tokens:
        raise RecordTrainError("--max-new-tokens extends --prompts sequences; with --replay the served "
                               "sequences are replayed exactly as served (leave it out)")
