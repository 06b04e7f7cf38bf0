"""A trainer's stored offline features, recognised by their files and read as that trainer reads them.

Two formats, each the tensors a draft was trained on (``record train --features DIR``):

- **SpecForge 0.2.0** offline features: ``*.ckpt`` / ``*.ckpt.gz`` files anywhere under DIR (its reader
  lists them recursively, sorted: runtime/data_plane/offline_reader.py:68-79 ``list_feature_files``;
  ``scripts/prepare_hidden_states.py`` writes ``rows_{g}-{g+N}/data_{i}.ckpt[.gz]``, :578-595), each one
  ``torch.save`` of ``{input_ids [T], loss_mask [T], hidden_state [1, T, H], aux_hidden_state [1, T, K*H]}``
  (offline_reader.py:46; prepare_hidden_states.py:446-480 saves only tensors, gzip-wrapped when compressed).
  SpecForge reads one with runtime/data_plane/feature_store.py:236-241 ``load_feature_file`` (gzip ->
  ``torch.load`` of the bytes; else ``torch.load(mmap=True)``) and normalises it with
  algorithms/eagle3/data.py:10-27 (``squeeze(0)`` of both hidden tensors). ``hidden_state`` is the target's
  last hidden state after its final norm (the SGLang logits processor's pruned states,
  offline_capture/sglang_backend/utils.py:62-90); SpecForge's target head applies the lm_head to it.
  specdiff reads the same bytes the same way but with ``torch.load(weights_only=True)``: SpecForge's
  ``weights_only=False`` would run any pickled code a file holds, and a trace's inputs must be safe to
  open, so no pickle runs; a file of tensors (all SpecForge writes) reads identically
  (tests/replay/record/test_features.py compares the two readers).
- **speculators 0.9.0** offline data: ``hs_{i}.safetensors`` in DIR or DIR/hidden_states (the
  ``generate-offline-data`` default output, cli/generate_offline_data.py:404-409), each written by vLLM's
  ``extract_hidden_states`` connector (vllm 0.32.0 example_hidden_states_connector.py:415-418) as
  ``{hidden_states [T, k+1, H], token_ids [T]}``. speculators reads it with hs_connectors 0.9.0
  transfer.py:124-143 ``FileTransfer.get_cached`` (``safetensors.torch.load_file``), checks it with
  data_generation/offline.py:10-33 ``check_hidden_states`` and splits it in train/data.py:317-333: the first
  k slices flattened are the aux concat ``hidden_states [T, k*H]``, the last one is
  ``verifier_last_hidden_states [T, H]`` (the vLLM id L that launch_vllm.py appends: the last decoder
  layer's output before the final norm; speculators applies ``verifier_norm`` then ``verifier_lm_head``,
  models/eagle3/core.py:248-253). Its loss mask lives in the arrow dataset, not in the file.

Nothing here is filled in: a file that does not hold what its format says is one error line naming it.
"""

from __future__ import annotations

import gzip
import io
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdiff.replay.trainers.errors import RecordTrainError

__all__ = ["FEATURE_FORMATS", "FeatureFile", "FeatureSet", "find_features", "read_specforge_file", "stored_prompts"]

#: the formats ``--features`` recognises
FEATURE_FORMATS = ("specforge", "speculators")
#: SpecForge 0.2.0 offline_reader.py:43 ``_FEATURE_SUFFIXES``
SPECFORGE_SUFFIXES = (".ckpt", ".ckpt.gz")
#: SpecForge 0.2.0 offline_reader.py:46 ``_OFFLINE_EAGLE3_KEYS``
SPECFORGE_KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")
#: speculators 0.9.0 / hs_connectors transfer.py:142 ``hs_{file_idx}.safetensors``
_HS_FILE = re.compile(r"^hs_(\d+)\.safetensors$")
#: speculators 0.9.0 data_generation/offline.py:11 ``required``
SPECULATORS_KEYS = ("token_ids", "hidden_states")


@dataclass(frozen=True)
class FeatureFile:
    """One stored sample.

    Attributes:
        path: the file.
        name: its path relative to the features directory (the trace's rid of its sequence).
    """

    path: Path
    name: str


@dataclass(frozen=True)
class FeatureSample:
    """One sample as the trainer reads it.

    Attributes:
        tokens: int64 [T], the token ids.
        aux_cat: [T, K*H] in the stored dtype, the aux hidden states concatenated (slot j = columns j*H..).
        last_hidden: [T, H] in the stored dtype, the target's last hidden state.
        last_prenorm: True when ``last_hidden`` is before the target's final norm (speculators: vLLM id L),
            False when after it (SpecForge's ``hidden_state``).
        loss_mask: int64 [T] or None (speculators keeps it in its arrow dataset).
        rid: the request id the file names (SpecForge's SGLang capture sink writes ``rid``), else None.
    """

    tokens: np.ndarray
    aux_cat: torch.Tensor
    last_hidden: torch.Tensor
    last_prenorm: bool
    loss_mask: np.ndarray | None = None
    rid: str | None = None


@dataclass
class FeatureSet:
    """The stored features of a directory.

    Attributes:
        format: one of ``FEATURE_FORMATS``.
        directory: the directory the files were found in.
        files: the samples, in the trainer's order (SpecForge: sorted paths; speculators: by index i).
        reader: who reads a file, in words with its source (recorded in the trace's contract).
        notes: plain-words remarks (what was read, what is not used).
    """

    format: str
    directory: Path
    files: list[FeatureFile]
    reader: str
    notes: list[str] = field(default_factory=list)

    def read(self, f: FeatureFile) -> FeatureSample:
        """One sample, read as its trainer reads it (module doc).

        Raises:
            RecordTrainError: the file does not hold what the format says (its path named).
        """
        return read_specforge_file(f.path) if self.format == "specforge" else read_speculators_file(f.path)

    def tokens(self, f: FeatureFile) -> np.ndarray:
        """int64 [T]: the token ids of one sample, without reading its hidden states where the format allows
        (a safetensors file's one tensor; a SpecForge ``.ckpt`` is memory-mapped)."""
        if self.format == "speculators":
            from safetensors import safe_open

            try:
                with safe_open(str(f.path), framework="pt") as sf:
                    return sf.get_tensor("token_ids").to(torch.int64).reshape(-1).numpy()
            except Exception as e:  # noqa: BLE001 - unreadable or without token_ids: the full read says which
                raise RecordTrainError(f"{f.path}: not a readable speculators hidden-states file "
                                       f"({type(e).__name__}: {e}); regenerate it") from None
        return self.read(f).tokens


def _bad(path: Path, what: str, fmt: str) -> RecordTrainError:
    return RecordTrainError(f"{path}: {what}; not a {fmt} offline feature file as its trainer reads it "
                            f"(replay/record/feature_files.py); regenerate it or leave it out of --features")


def read_specforge_file(path: Path) -> FeatureSample:
    """A SpecForge 0.2.0 feature file (module doc), read as feature_store.py:236-241 ``load_feature_file`` reads
    it, with ``weights_only=True``, and normalised as algorithms/eagle3/data.py:15-18 does.

    Raises:
        RecordTrainError: unreadable, a pickled object other than tensors, a key missing, or shapes that
            disagree (the path and what is wrong).
    """
    try:
        if str(path).endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                raw = torch.load(io.BytesIO(fh.read()), map_location="cpu", weights_only=True)
        else:
            raw = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # noqa: BLE001 - corrupt, truncated or holding Python objects: one line
        text = " ".join(str(e).split())[:200]
        raise _bad(path, f"torch.load(weights_only=True) cannot read it ({type(e).__name__}: {text})",
                   "SpecForge") from None
    if not isinstance(raw, dict):
        raise _bad(path, f"holds a {type(raw).__name__}, not a dict of tensors", "SpecForge")
    missing = [k for k in SPECFORGE_KEYS if not torch.is_tensor(raw.get(k))]
    if missing:
        raise _bad(path, f"no tensor {', '.join(missing)} (SpecForge offline_reader.py:46 requires "
                         f"{', '.join(SPECFORGE_KEYS)})", "SpecForge")
    ids = raw["input_ids"].reshape(-1).to(torch.int64)
    aux = raw["aux_hidden_state"].squeeze(0)
    last = raw["hidden_state"].squeeze(0)
    T = ids.shape[0]
    if aux.dim() != 2 or last.dim() != 2 or aux.shape[0] != T or last.shape[0] != T:
        raise _bad(path, f"input_ids has {T} tokens but aux_hidden_state {list(raw['aux_hidden_state'].shape)} and "
                         f"hidden_state {list(raw['hidden_state'].shape)} (expected [1, T, K*H] and [1, T, H])",
                   "SpecForge")
    rid = raw.get("rid")
    return FeatureSample(ids.numpy(), aux, last, last_prenorm=False,
                         loss_mask=raw["loss_mask"].reshape(-1).to(torch.int64).numpy(),
                         rid=rid if isinstance(rid, str) else None)


def read_speculators_file(path: Path) -> FeatureSample:
    """A speculators 0.9.0 hidden-states file (module doc), read by hs_connectors' ``FileTransfer`` when it
    imports (else ``safetensors.torch.load_file``, what it calls), checked by speculators'
    ``check_hidden_states`` when it imports, and split as train/data.py:317-333 splits it.

    Raises:
        RecordTrainError: unreadable, a key missing, or shapes that disagree (the path and what is wrong).
    """
    m = _HS_FILE.match(path.name)
    try:
        try:
            from hs_connectors import FileTransfer

            raw = FileTransfer(path.parent).get_cached(int(m.group(1))) if m else None
        except ImportError:
            raw = None
        if raw is None:
            from safetensors.torch import load_file

            raw = load_file(str(path))
    except Exception as e:  # noqa: BLE001 - a corrupt or truncated file: one line
        raise _bad(path, f"safetensors cannot read it ({type(e).__name__}: {e})", "speculators") from None
    missing = [k for k in SPECULATORS_KEYS if k not in raw]
    if missing:
        raise _bad(path, f"no {', '.join(missing)} (speculators data_generation/offline.py:11 requires "
                         f"{', '.join(SPECULATORS_KEYS)})", "speculators")
    ids = raw["token_ids"].reshape(-1).to(torch.int64)
    hs = raw["hidden_states"]
    try:
        from speculators.data_generation.offline import check_hidden_states

        check_hidden_states(raw, ids.tolist())
    except ImportError:
        pass
    except ValueError as e:
        raise _bad(path, f"speculators' check_hidden_states refuses it ({e})", "speculators") from None
    if hs.dim() != 3 or hs.shape[0] != ids.shape[0] or hs.shape[1] < 2:
        raise _bad(path, f"hidden_states {list(hs.shape)} for {ids.shape[0]} tokens (expected [T, k+1, H]: k aux "
                         "layers and the verifier's last hidden state)", "speculators")
    return FeatureSample(ids.numpy(), hs[:, :-1].flatten(1), hs[:, -1], last_prenorm=True)


def _specforge_files(d: Path) -> list[Path]:
    """SpecForge's own listing when it imports (offline_reader.py:68-79), else the same rule."""
    try:
        from specforge.runtime.data_plane.offline_reader import list_feature_files

        return [Path(p) for p in list_feature_files(str(d))]
    except ImportError:
        return sorted(p for p in d.rglob("*") if p.is_file() and p.name.endswith(SPECFORGE_SUFFIXES))


def _speculators_files(d: Path) -> tuple[Path, list[Path]]:
    """(the directory holding them, ``hs_{i}.safetensors`` by index i) in ``d`` or ``d/hidden_states``."""
    for where in (d, d / "hidden_states"):
        found = [p for p in where.glob("hs_*.safetensors") if _HS_FILE.match(p.name)] if where.is_dir() else []
        if found:
            return where, sorted(found, key=lambda p: int(_HS_FILE.match(p.name).group(1)))
    return d, []


def find_features(directory, *, limit: int | None = None) -> FeatureSet:
    """The feature files of ``directory``, recognised by their names (module doc).

    Args:
        limit: keep the first this many samples (the trainer's order); None: all.

    Raises:
        RecordTrainError: no such directory, no file of either format, or files of both.
    """
    d = Path(directory)
    if not d.is_dir():
        raise RecordTrainError(f"--features {directory}: no such directory")
    sf = _specforge_files(d)
    hs_dir, hs = _speculators_files(d)
    if sf and hs:
        raise RecordTrainError(f"--features {directory}: holds both SpecForge feature files ({sf[0].name}, ...) and "
                               f"speculators hidden-states files ({hs[0].name}, ...); give the directory of one")
    if not sf and not hs:
        raise RecordTrainError(f"--features {directory}: no trainer's feature files there: SpecForge writes "
                               f"*.ckpt / *.ckpt.gz (scripts/prepare_hidden_states.py), speculators hs_{{i}}.safetensors "
                               "(speculators generate-offline-data, in DIR or DIR/hidden_states)")
    if sf:
        files = [FeatureFile(p, p.relative_to(d).as_posix()) for p in sf]
        fs = FeatureSet("specforge", d, files,
                        "SpecForge 0.2.0 feature file (runtime/data_plane/feature_store.py:236-241 load_feature_file's "
                        "format), read with torch.load(weights_only=True)")
    else:
        files = [FeatureFile(p, p.name) for p in hs]
        fs = FeatureSet("speculators", hs_dir, files,
                        "speculators 0.9.0 hidden-states file (hs_connectors transfer.py:124-143 FileTransfer, "
                        "split as speculators train/data.py:317-333)",
                        ["the loss mask lives in speculators' arrow dataset, not in hs_{i}.safetensors: every "
                         "position is replayed (a draft is served at every position)"])
    if limit is not None:
        fs.files = fs.files[:limit]
    return fs


def stored_prompts(directory, *, limit: int | None = None) -> list[dict]:
    """``[{"input_ids": [...], "rid": name}]``: every stored sample's token ids, in the trainer's order, as
    ``specdiff record client --prompts-from-features`` sends them (samples of fewer than 2 tokens too: the
    server answers them, record train --features leaves them out).

    Raises:
        RecordTrainError: as ``find_features``, or a file that cannot be read.
    """
    fs = find_features(directory, limit=limit)
    return [{"input_ids": [int(t) for t in fs.tokens(f)], "rid": f.name} for f in fs.files]
