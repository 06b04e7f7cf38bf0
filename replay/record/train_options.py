"""What ``record train`` does with options the caller leaves unset (torch-free, so the CLI can
show the defaults in its help without importing torch).

Every value filled in from here is stored, with its source, in the training trace's contract
field ``defaults_used`` (``tracer.contract.DEFAULTS_USED``).
"""

from __future__ import annotations

import os

from specdiff.replay.trainers.errors import RecordTrainError

DTYPE_NAMES = ("bfloat16", "float32", "float16")
CAPTURE_LEVELS = ("default", "full")
#: the value of each option the caller leaves unset; bf16 is the serving dtype, which keeps the
#: tolerances against a serving trace tight (replay/model/target_capture.py gives the measurement)
DEFAULTS = {"dtype": "bfloat16", "target_dtype": "bfloat16", "capture": "default", "probe_positions": 64,
            "max_new_tokens": 0, "batch_size": 8}
#: ``--device`` left unset: what this machine has (``default_device``); the help's wording
DEVICE_DEFAULT = "cuda when torch sees a CUDA device, else cpu"
#: steps / topk when there is no serving trace (its spec_steps / spec_topk) to take them from
FALLBACK_STEPS, FALLBACK_TOPK = 3, 1
#: --aux-convention when --aux-layers is given alone
AUX_CONVENTION_DEFAULT = "hf"
#: the ``defaults_used`` names that are command-line options
OPTIONS = frozenset(DEFAULTS) | {"device", "steps", "topk", "aux_layers", "aux_convention"}


def default_device(cuda_available: bool) -> dict:
    """The ``defaults_used`` entry of ``--device`` left unset: ``cuda`` when ``cuda_available``
    (``torch.cuda.is_available()``, read by the caller: this module does not import torch), else ``cpu``;
    the trace's ``engine_options.device`` holds the device used either way."""
    if cuda_available:
        return {"value": "cuda", "source": "record train default: torch sees a CUDA device"}
    return {"value": "cpu", "source": "record train default: torch sees no CUDA device"}


def fill_defaults(given: dict, served: dict, *, cuda_available: bool) -> tuple[dict, dict[str, dict]]:
    """``given`` (option name -> value or None) with every None replaced, and the
    ``defaults_used`` entries (name -> ``{"value", "source"}``) for what was filled in.

    ``device``: ``default_device(cuda_available)``.

    steps / topk come from the serving trace (``spec_steps`` / ``spec_topk``) when there is one,
    so the training side drafts as deep and as wide as serving did; else ``FALLBACK_*``.
    """
    values, used = dict(given), {}
    for name, default in DEFAULTS.items():
        if name in values and values[name] is None:
            values[name] = default
            used[name] = {"value": default, "source": "record train default"}
    if "device" in values and values["device"] is None:
        used["device"] = default_device(cuda_available)
        values["device"] = used["device"]["value"]
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


def check_device(device: str | None) -> None:
    """Refuse a ``--device`` torch cannot name or this machine does not have (before the models load).
    Imports torch (not the model stack: the CLI says this in seconds).

    Raises:
        RecordTrainError: one line naming the devices there are.
    """
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise RecordTrainError(f"--device {device!r}: not a torch device; use cpu, cuda or cuda:N") from None
    count = torch.cuda.device_count() if dev.type == "cuda" else None
    if count is not None and (count == 0 or (dev.index or 0) >= count):
        raise RecordTrainError(f"--device {device}: this machine has {count} CUDA device(s); use --device cpu"
                               + (f" or cuda:0..cuda:{count - 1}" if count else ""))


def check_aux_convention(aux_layers, aux_convention) -> None:
    """Refuse ``--aux-convention`` without ``--aux-layers`` (it says how to read them).

    Raises:
        RecordTrainError: one line saying what to give.
    """
    if aux_convention is not None and aux_layers is None:
        raise RecordTrainError(f"--aux-convention {aux_convention} says how to read --aux-layers, which is "
                               "missing; give both (e.g. --aux-layers 0,3,6 --aux-convention hf) or neither "
                               "(the draft config's ids in its own convention)")


#: the options that act on a target forward, which ``--features`` does not run
TARGET_FORWARD_OPTIONS = ("--target-dtype", "--probe-positions", "--max-new-tokens")


def check_usage(*, replay, prompts, features, max_samples, aux_layers, aux_convention, steps, topk,
                probe_positions, max_new_tokens, batch_size, target_dtype, out: str, overwrite: bool) -> None:
    """What ``record train``'s command line alone shows it cannot use as given, refused before torch and
    transformers are imported (seconds): which sequences (exactly one of ``--replay``, ``--prompts``,
    ``--features``), the options that go with them, the counts (``check_counts``), ``--aux-convention``
    (``check_aux_convention``) and an existing ``--out`` without ``--overwrite``. What needs torch or the
    files (``--device``, ``--trainer``, the models, the sequences) is checked by ``record_train``.

    Raises:
        RecordTrainError: one line naming the option.
    """
    given = [opt for opt, value in (("--replay", replay), ("--prompts", prompts), ("--features", features))
             if value is not None]
    if len(given) != 1:
        raise RecordTrainError("give exactly one of --replay SERVE_TRACE, --prompts FILE.jsonl or --features DIR"
                               + (f" (got {' and '.join(given)})" if given else ""))
    if max_samples is not None and features is None:
        raise RecordTrainError("--max-samples picks stored samples of --features; give --features DIR")
    if features is not None:
        for opt, value in zip(TARGET_FORWARD_OPTIONS, (target_dtype, probe_positions, max_new_tokens)):
            if value is not None:
                raise RecordTrainError(f"{opt} acts on a target forward, which --features does not run; leave it out")
    check_aux_convention(aux_layers, aux_convention)
    check_counts(steps=steps, topk=topk, probe_positions=probe_positions, max_new_tokens=max_new_tokens,
                 batch_size=batch_size, replay=replay)
    if not overwrite and os.path.exists(out):
        raise RecordTrainError(f"{out}: already exists; choose another path or pass --overwrite")


#: the ``--target-backend`` that runs the target in transformers in this process; every other value names the
#: serving engine that runs it (replay/record/engine_target.py, replay/record/record_engine.py)
IN_PROCESS_BACKEND = "transformers"
#: ``--target-backend`` values
TARGET_BACKENDS = (IN_PROCESS_BACKEND, "sglang")


def check_backend(*, backend: str, features, tp_size, engine_args, device_map, probe_positions, max_new_tokens,
                  specforge) -> None:
    """The options that go with ``--target-backend`` (before torch is imported): the engine's settings only with
    ``sglang``, ``--device-map`` only with ``transformers``; ``sglang`` runs no ``--features`` (no target forward
    there), returns no layer probes and extends no prompts.

    Raises:
        RecordTrainError: one line naming the option.
    """
    if backend == IN_PROCESS_BACKEND:
        for opt, value in (("--tp-size", tp_size), ("--engine-args", engine_args)):
            if value is not None:
                raise RecordTrainError(f"{opt} sets SGLang's engine; add --target-backend sglang, or leave it out")
        return
    for opt, value in (("--features", features), ("--device-map", device_map), ("--probe-positions", probe_positions),
                       ("--max-new-tokens", max_new_tokens), ("--specforge-checkpoint/--specforge-config", specforge)):
        if value is not None:
            raise RecordTrainError(f"{opt} does not go with --target-backend sglang (the engine runs the target "
                                   "forward of the given sequences, its training layers only); leave it out")
