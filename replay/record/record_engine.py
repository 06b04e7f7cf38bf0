"""``record train --target-backend sglang``: the training trace of token sequences whose target forward runs
in SGLang's engine (replay/record/engine_target.py), the draft forward as ``record train`` runs it.

The sequences (a serving trace's, or a prompts file's), the draft, the training layers, the contract and the
writer are ``record train``'s (``sequences``, ``load_train_side``, ``write_train_trace``); only the target is
replaced, as ``record train --features`` replaces it with stored files (replay/record/record_features.py).
What this side cannot know is recorded as such: the live-target facts (no transformers module is built), the
layer probes (the engine returns the training layers only) and the target stages' noise floor (the engine is
not re-run at another precision). The contract field ``engine_target`` says what the engine was given, which
SGLang ids captured which HF indices, and where they came from.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import partial
from pathlib import Path

from specdiff.replay.model.target_capture import TargetError
from specdiff.replay.model.target_head import load_target_head
from specdiff.replay.record.engine_target import EngineSettings, SGLangTarget
from specdiff.replay.record.noise_floor import without_target_floor
from specdiff.replay.record.record_features import LIVE_TARGET_FACTS
from specdiff.replay.record.record_train import check_train_options, load_train_side
from specdiff.replay.record.sequences import sequences_from_prompts, sequences_from_trace
from specdiff.replay.record.train_writer import RecordTrainResult, write_train_trace
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.tracer.contract import UNKNOWN

__all__ = ["ENGINE_TARGET_FIELD", "record_engine"]

#: the contract field (tracer/contract_fields.py)
ENGINE_TARGET_FIELD = "engine_target"
#: why its noise floor has no target.* stages (noise_floor.without_target_floor)
ENGINE_FLOOR_WHY = "the engine is not re-run at another precision"


def _amend(target: SGLangTarget, hf_indices) -> Callable[[dict], None]:
    why = {"why": "record train --target-backend sglang builds no transformers target: SGLang runs it",
           "fix": "record train --target-backend transformers where the target fits"}

    def amend(facts: dict) -> None:
        for f in LIVE_TARGET_FACTS:
            if f in facts:
                facts[f] = UNKNOWN
                facts.setdefault("unknown_reasons", {})[f] = dict(why)
        facts[ENGINE_TARGET_FIELD] = target.facts(hf_indices)
    return amend


def record_engine(target_dir, draft_dir, out: str, *, replay: str | None = None, prompts=None,
                  settings: EngineSettings, aux_layers=None, aux_convention: str | None = None,
                  steps: int | None = None, topk: int | None = None, dtype: str | None = None,
                  target_dtype: str | None = None, capture: str | None = None, batch_size: int | None = None,
                  trainer: str | None = None, draft_window: int | None = None, noise_floor: bool = True,
                  overwrite: bool = False, log_path=None, progress: Callable[[int], None] | None = None,
                  on_start: Callable[[int, RecordTrainResult], None] | None = None) -> RecordTrainResult:
    """Write the training trace of ``replay``'s (or ``prompts``') sequences with the target in SGLang.

    Args:
        settings: the engine's settings as given (``EngineSettings``: ``--tp-size``, ``--engine-args``,
            the device SGLang runs on).
        target_dtype: SGLang's ``--dtype`` (default bf16, ``record train``'s).
        log_path: the capture server's log (default: the launcher's).
        the rest: as ``record_train``; the draft runs on ``settings.device``.

    Raises:
        RecordTrainError / TargetError / CheckpointError / TraceError: one line each.
    """
    if (replay is None) == (prompts is None):
        raise RecordTrainError("give exactly one of --replay SERVE_TRACE or --prompts FILE.jsonl")
    check_train_options(aux_layers=aux_layers, aux_convention=aux_convention, steps=steps, topk=topk, dtype=dtype,
                        target_dtype=target_dtype, capture=capture, batch_size=batch_size, replay=replay,
                        device=settings.device, trainer=trainer)
    if not overwrite and Path(str(out)).exists():
        raise RecordTrainError(f"{out}: already exists; choose another path or pass --overwrite")
    if importlib.util.find_spec("sglang") is None:
        raise RecordTrainError("--target-backend sglang: SGLang is not installed in this Python; pip install "
                               "'specdiff[sglang]' (SGLang 0.5.23), or use --target-backend transformers")
    served, token_defaults = {}, {}
    if replay is not None:
        seqs, served = sequences_from_trace(replay)
    else:
        seqs = sequences_from_prompts(prompts, Path(target_dir), defaults_used=token_defaults)
    try:
        head = load_target_head(target_dir, need_norm=False)
    except TargetError as e:
        raise RecordTrainError(str(e)) from None
    target = SGLangTarget(head, target_dir, settings, dtype=target_dtype or "bfloat16", log_path=log_path)
    side = load_train_side(target_dir, draft_dir, served=served, aux_layers=aux_layers, aux_convention=aux_convention,
                           steps=steps, topk=topk, dtype=dtype, target_dtype=target_dtype, capture=capture,
                           probe_positions=0, max_new_tokens=0, batch_size=batch_size, device=settings.device,
                           extra_defaults=token_defaults, trainer=trainer, draft_window=draft_window, target=target)
    side.defaults_used.pop("probe_positions", None)  # not an option here: the engine returns no probes
    side.options["target_backend"] = "sglang"  # and the engine's settings as given (engine_options)
    side.options.update({k: v for k, v in (("tp_size", settings.tp_size), ("engine_args", list(settings.engine_args)))
                         if v})
    target.dtype = side.options["target_dtype"]
    side.amend_facts = _amend(target, side.aux.hf_indices)
    target.start(side.aux.hf_indices)
    said = [f"target in SGLang ({settings.device}{', ' + ' '.join(settings.server_args()) if settings.server_args() else ''}):"
            f" ids {target.ids} capture the training layers HF {list(side.aux.hf_indices)} (slot order from the "
            f"engine {target.order}); target.logits_topk not recorded (SGLang returns no logits)"]

    def started(total: int, stub: RecordTrainResult) -> None:
        stub.notes[:0] = said
        if on_start:
            on_start(total, stub)

    try:
        return write_train_trace(side, seqs, str(out), replay=replay, overwrite=overwrite, noise_floor=noise_floor,
                                 floor_filter=partial(without_target_floor, why=ENGINE_FLOOR_WHY),
                                 progress=progress, on_start=started)
    finally:
        target.close()
