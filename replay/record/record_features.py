"""``record train --features DIR``: a training trace from a trainer's stored features, no target run.

The features a trainer stored (SpecForge's offline ``.ckpt`` files, speculators' ``hs_{i}.safetensors``;
replay/record/feature_files.py) are the very hidden states its draft learned from. This records them as the
training side: ``tokens`` and ``target.aux.{j}`` / ``target.aux_cat`` are the stored tensors, ``target.argmax``
the target's greedy token from the stored last hidden state (replay/record/feature_target.py), and every
draft stage the draft's teacher-forced forward on them (the reference, or ``--trainer``'s own), through the
same ``TrainSide`` and writer as ``record train`` (the target is replaced by ``FeatureTarget``: nothing but
the target's config, embedding, lm_head and final norm is read; replay/model/target_head.py).

The layers the files hold come from the trainer's records or the user (replay/record/feature_layers.py) and
are the trace's training layers (``aux_concat_order``); contract field ``features`` says what was read, by
which reader, and where the layers came from. What the features side cannot know is recorded as such:
``target_structure`` unknown (no target was built), no layer probes, and a noise floor of the draft stages
only (the target stages were computed elsewhere, so their rounding is not re-run here).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

from specdiff.eagle3.aux_layers import target_architecture
from specdiff.replay.model.target_capture import TargetError
from specdiff.replay.model.target_head import load_target_head
from specdiff.replay.record.feature_files import find_features
from specdiff.replay.record.feature_layers import feature_layers, read_offline_capture
from specdiff.replay.record.feature_target import FeatureTarget, feature_sequences
from specdiff.replay.record.noise_floor import without_target_floor
from specdiff.replay.record.record_train import check_train_options, load_train_side
from specdiff.replay.record.specforge_contract import read_specforge
from specdiff.replay.record.train_writer import RecordTrainResult, write_train_trace
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.paths import recorded_path

__all__ = ["FEATURES_FIELD", "record_features"]

#: the contract field (tracer/contract_fields.py)
FEATURES_FIELD = "features"
#: why its noise floor has no target.* stages (noise_floor.without_target_floor)
FEATURES_FLOOR_WHY = "the stored features are the target side, computed where they were stored"


#: facts ``record train`` reads off its live target module, which the features side does not have
LIVE_TARGET_FACTS = ("target_structure", "target_buffers", "target_rope")


def _amend(fs, layers, head, first, *, stored: str, replayed: int, notes: list[str]) -> Callable[[dict], None]:
    """The features side's changes to the computed contract (module doc): the live-target facts unknown
    with their reason, the stored dtype as ``target_dtype``, and the ``features`` fact."""
    why = {"why": "record train --features builds no target: the stored features stand for its forward",
           "fix": "none on this side: the target itself is compared where it runs (serving, or record train "
                  "--replay of this trace)"}

    def amend(facts: dict) -> None:
        for f in LIVE_TARGET_FACTS:
            if f in facts:
                facts[f] = UNKNOWN
                facts.setdefault("unknown_reasons", {})[f] = dict(why)
        facts["target_dtype"] = stored
        facts[FEATURES_FIELD] = {
            "format": fs.format, "directory": recorded_path(fs.directory), "samples": len(fs.files),
            "replayed": replayed, "reader": fs.reader, "dtype": stored, "capture_layers": layers.facts,
            "last_hidden": ("before the target's final norm (normed here, then its lm_head)" if first.last_prenorm
                            else "after the target's final norm (its lm_head applied here)"),
            "target_tensors": dict(head.sources), "notes": fs.notes + notes,
        }
    return amend


def record_features(features_dir, target_dir, draft_dir, out: str, *, aux_layers=None,
                    aux_convention: str | None = None, specforge_checkpoint=None, specforge_config=None,
                    max_samples: int | None = None, steps: int | None = None, topk: int | None = None,
                    dtype: str | None = None, capture: str | None = None, batch_size: int | None = None,
                    device: str | None = None, trainer: str | None = None, draft_window: int | None = None,
                    noise_floor: bool = True, overwrite: bool = False,
                    progress: Callable[[int], None] | None = None,
                    on_start: Callable[[int, RecordTrainResult], None] | None = None) -> RecordTrainResult:
    """Write the training trace of the stored features in ``features_dir`` at ``out`` (module doc).

    Args:
        features_dir: a SpecForge or speculators features directory (recognised by its files).
        target_dir: the target's HF directory: its config, embedding, lm_head and final norm are read.
        draft_dir: the draft checkpoint (either format).
        aux_layers / aux_convention: the layers the files hold, slot j = the j-th id (feature_layers.py);
            default: the trainer's records (SpecForge: ``specforge_config`` of the offline run, else the
            checkpoint's provenance: ``specforge_checkpoint`` or a training_state.pt beside the draft).
        max_samples: the first this many samples (the trainer's order); None: all.
        steps / topk / dtype / capture / batch_size / device / trainer / draft_window / noise_floor: as
            ``record_train``.

    Raises:
        RecordTrainError / TargetError / CheckpointError / TraceError: one line each.
    """
    check_train_options(aux_layers=aux_layers, aux_convention=aux_convention, steps=steps, topk=topk, dtype=dtype,
                        capture=capture, batch_size=batch_size, device=device, trainer=trainer)
    if max_samples is not None and max_samples < 1:
        raise RecordTrainError(f"--max-samples {max_samples}: must be >= 1")
    if not overwrite and Path(str(out)).exists():
        raise RecordTrainError(f"{out}: already exists; choose another path or pass --overwrite")
    fs = find_features(features_dir, limit=max_samples)
    seqs, notes = feature_sequences(fs)
    first = fs.read(seqs[0].file)
    try:
        head = load_target_head(target_dir, need_norm=first.last_prenorm)
    except TargetError as e:
        raise RecordTrainError(str(e)) from None
    text = head.config.get_text_config()
    H, L = int(text.hidden_size), int(text.num_hidden_layers)
    width = int(first.aux_cat.shape[1])
    if width % H:
        raise RecordTrainError(f"{seqs[0].file.path}: aux width {width} is not a multiple of the target's hidden size "
                               f"{H}: these features are not of --target {target_dir}")
    if fs.format != "specforge" and (specforge_checkpoint or specforge_config):
        raise RecordTrainError(f"--specforge-checkpoint / --specforge-config are SpecForge's records; --features "
                               f"{features_dir} holds {fs.format} files: leave them out")
    specforge = read_specforge(draft_dir, checkpoint=specforge_checkpoint) if fs.format == "specforge" else None
    offline = read_offline_capture(specforge_config) if specforge_config is not None else None
    layers = feature_layers(fs, slots=width // H, num_layers=L, architecture=target_architecture(head.config.to_dict()),
                            aux_layers=aux_layers, aux_convention=aux_convention, specforge=specforge, offline=offline)
    target = FeatureTarget(head, fs, slots=width // H, hidden=H)
    side = load_train_side(target_dir, draft_dir, steps=steps, topk=topk, dtype=dtype, capture=capture,
                           probe_positions=0, max_new_tokens=0, batch_size=batch_size, device=device,
                           trainer=trainer, draft_window=draft_window, target=target, aux=layers.aux)
    side.specforge = specforge
    target.to(side.options["device"])  # its lm_head and norm compute the labels where the draft runs
    side.defaults_used.pop("target_dtype", None)  # no target runs: the stored dtype is the fact (target_dtype)
    side.amend_facts = _amend(fs, layers, head, first, stored=str(first.aux_cat.dtype).removeprefix("torch."),
                              replayed=len(seqs), notes=notes)
    said = [f"features: {fs.format} ({fs.reader}); capture layers HF {list(layers.aux.hf_indices)} from "
            f"{layers.source}", *fs.notes, *notes]

    def started(total: int, stub: RecordTrainResult) -> None:
        stub.notes[:0] = said
        if on_start:
            on_start(total, stub)

    return write_train_trace(side, seqs, str(out), overwrite=overwrite, noise_floor=noise_floor,
                             floor_filter=partial(without_target_floor, why=FEATURES_FLOOR_WHY),
                             progress=progress, on_start=started)
