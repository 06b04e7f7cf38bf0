"""Which target layers a trainer's stored features hold, and in which concat order: from the trainer's own
records or from the user, never guessed (``record train --features``).

Sources, in this order:

1. the user: ``--aux-layers IDS`` (``--aux-convention``, default ``hf``), slot j = the j-th id, as listed;
2. SpecForge 0.2.0 features, from SpecForge's own records of the run (its ``prepare_hidden_states.py`` writes
   nothing beside the files: it resolves the layers from the run config and prints them, :776-797):
   a. ``--specforge-config`` of the offline run: SpecForge's ``resolve_offline_capture``
      (application/composition.py:60-125), the very call ``prepare_hidden_states.py`` captures with
      (:317-346 ``resolve_offline_capture_plan``, :349-371 ``set_capture_layers``);
   b. the model provenance of its checkpoint (``--specforge-checkpoint``, or a ``training_state.pt`` beside
      the draft; replay/record/specforge_contract.py): ``capture_layers``, resolved by the same
      ``resolve_capture_layers`` when the run was assembled.
   SpecForge's offline capture hands those ids to SGLang's ``set_eagle3_layers_to_capture``
   (offline_capture/sglang_backend/capture.py:86-112), so they are read by SGLang's rule for the target's
   family (eagle3/families.py) and concatenated as SGLang concatenates: ascending.
3. speculators 0.9.0 data: none. ``generate-offline-data`` writes only ``hs_{i}.safetensors`` and the vLLM
   server it reads from was launched by ``scripts/launch_vllm.py`` with the ids inside its
   ``--speculative_config`` (printed, not saved): the user gives them (source 1).

With no source: one error line saying which option to give.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

from specdiff.eagle3.aux_layers import ConventionError, resolve_aux_ids
from specdiff.eagle3.engines import engine_spec
from specdiff.replay.record.feature_files import FeatureSet
from specdiff.replay.record.train_aux import TrainAux
from specdiff.replay.record.train_options import AUX_CONVENTION_DEFAULT
from specdiff.replay.trainers.errors import RecordTrainError

__all__ = ["FeatureLayers", "feature_layers", "read_offline_capture"]


@dataclass(frozen=True)
class FeatureLayers:
    """The stored features' layers.

    Attributes:
        aux: the resolution: ``hf_indices`` = HF index of each stored slot, in the files' concat order.
        source: where they came from, in words (its file and the trainer source that says so).
        facts: ``{ids, convention, concat, source}`` for the trace's contract (``features.capture_layers``).
    """

    aux: TrainAux
    source: str
    facts: dict


def read_offline_capture(config_path) -> dict:
    """The capture SpecForge's ``prepare_hidden_states.py`` performs for the offline run config ``config_path``:
    SpecForge's ``load_config`` then ``resolve_offline_capture`` (module doc, 2a).

    Returns:
        {file, capture_layers (SpecForge's ids, as resolved), capture_method}.

    Raises:
        RecordTrainError: SpecForge not installed (the pip line), or the config does not load, is not an
            offline run, or SpecForge refuses it.
    """
    from specdiff.replay.record.specforge_contract import _one_line
    from specdiff.replay.trainers.registry import TRAINERS, trainer_version

    where = f"--specforge-config {config_path}"
    if trainer_version("specforge") is None:
        raise RecordTrainError(f"{where}: SpecForge resolves its capture layers itself and is not installed; run "
                               f"`{TRAINERS['specforge'].pip}` (or `make install`)")
    from specforge.application.composition import resolve_offline_capture
    from specforge.config import load_config

    try:
        cfg = load_config(str(config_path))
    except Exception as e:  # noqa: BLE001 - a missing file, bad YAML or a refusal: one line
        raise RecordTrainError(f"{where}: SpecForge cannot load it ({_one_line(e)})") from None
    if cfg.mode != "offline":
        raise RecordTrainError(f"{where}: an {cfg.mode} run; the features were prepared by an offline run "
                               "(data.hidden_states_path): give that run's config")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # a trace command's stdout is its report
            got = resolve_offline_capture(cfg)
    except Exception as e:  # noqa: BLE001 - SpecForge's own refusal, in one line
        raise RecordTrainError(f"{where}: SpecForge cannot resolve its offline capture ({_one_line(e)})") from None
    return {"file": str(Path(config_path).resolve()), "capture_layers": [int(i) for i in got.capture_layers],
            "capture_method": str(got.capture_method)}


def _specforge_source(specforge, offline: dict | None) -> tuple[list[int], str] | None:
    """(SpecForge ids, source words) from the offline capture plan, else the checkpoint provenance."""
    if offline is not None:
        return offline["capture_layers"], (f"SpecForge's offline capture of {offline['file']} (resolve_offline_capture, "
                                           "application/composition.py:60-125, as scripts/prepare_hidden_states.py "
                                           "captures: :317-371)")
    ckpt = getattr(specforge, "checkpoint", None)
    layers = (ckpt or {}).get("model_provenance", {}).get("capture_layers")
    if layers is not None:
        return [int(i) for i in layers], (f"the model provenance capture_layers of SpecForge checkpoint {ckpt['file']} "
                                          "(training/provenance.py:263-292)")
    return None


def _missing(fs: FeatureSet) -> RecordTrainError:
    if fs.format == "specforge":
        return RecordTrainError(
            f"--features {fs.directory}: SpecForge writes no record of the capture layers beside its feature files "
            "(prepare_hidden_states.py resolves them from the run config and prints them): give the offline run's "
            "config with --specforge-config RUN.yaml (SpecForge resolves them), its checkpoint with "
            "--specforge-checkpoint, or the layers with --aux-layers IDS --aux-convention sglang (the ids "
            "SpecForge's capture passed to SGLang), in the files' concat order")
    return RecordTrainError(
        f"--features {fs.directory}: speculators writes no record of the capture layers beside hs_{{i}}.safetensors "
        "(launch_vllm.py passes them to vLLM in --speculative_config and keeps no copy): give --aux-layers IDS "
        "--aux-convention vllm, the eagle_aux_hidden_state_layer_ids vLLM extracted with, without the last id L "
        "launch_vllm.py appends (the verifier's last hidden state)")


def feature_layers(fs: FeatureSet, *, slots: int, num_layers: int, architecture: str | None,
                   aux_layers=None, aux_convention: str | None = None, specforge=None,
                   offline: dict | None = None) -> FeatureLayers:
    """The layers of ``fs`` (module doc: the user's first, else the trainer's records).

    Args:
        slots: K, the aux slots the files hold (their aux width / the target's hidden size).
        num_layers / architecture: the target's L and ``architectures[0]`` (SGLang's rule per family).
        aux_layers / aux_convention: ``--aux-layers`` / ``--aux-convention``.
        specforge: the ``SpecForgeRecord`` read for the draft (checkpoint provenance), or None.
        offline: ``read_offline_capture`` of ``--specforge-config``, or None.

    Raises:
        RecordTrainError: no source (which option to give), ids a convention cannot read, or a count other
            than ``slots``.
    """
    if aux_layers is not None:
        conv, ids, concat = aux_convention or AUX_CONVENTION_DEFAULT, [int(i) for i in aux_layers], "listed"
        source = f"--aux-layers {','.join(map(str, ids))} --aux-convention {conv} (given; slot j = the j-th id)"
    else:
        found = _specforge_source(specforge, offline) if fs.format == "specforge" else None
        if found is None:
            raise _missing(fs)
        ids, source = found
        conv, concat = "sglang", engine_spec("sglang").aux_concat
        source += ("; SpecForge's capture hands its ids to SGLang's set_eagle3_layers_to_capture "
                   "(offline_capture/sglang_backend/capture.py:86-112): read by SGLang's rule, concatenated ascending")
    try:
        res = resolve_aux_ids(ids, convention=conv, num_layers=num_layers, concat=concat, architecture=architecture)
    except ConventionError as e:
        raise RecordTrainError(f"capture layers of --features from {source}: {e}") from None
    if res.dropped:
        raise RecordTrainError(f"capture layers of --features from {source}: ids {list(res.dropped)} capture nothing "
                               f"({'; '.join(res.notes)})")
    if len(res.hf_indices) != slots:
        raise RecordTrainError(f"capture layers of --features from {source}: {len(res.hf_indices)} layers HF "
                               f"{list(res.hf_indices)}, but the files hold {slots} aux slots")
    aux = TrainAux(res.hf_indices, res.ids, res.convention, res.dropped, res.notes, res.concat)
    return FeatureLayers(aux, source, {"ids": list(ids), "convention": conv, "concat": concat, "source": source,
                                       "hf_indices": list(res.hf_indices)})
