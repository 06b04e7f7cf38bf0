"""What SpecForge 0.2.0 itself recorded of a training run, read as training-side contract facts.

``record train`` reads, when it has them:

- the **model provenance** of a SpecForge checkpoint (``--specforge-checkpoint DIR|FILE``, else a
  ``training_state.pt`` in the draft directory or in its parent, e.g. a draft exported into the
  checkpoint's directory). SpecForge writes the shared payload ``{draft_state_dict, global_step, epoch,
  ..., strategy, run_id, world_size, **checkpoint_extra}`` (training/controller.py:839-866) to
  ``{output_dir}/{run_id}-step{N}/training_state.pt`` (training/checkpoint.py:32, :55-56, :98-99);
  ``checkpoint_extra`` is the trainer's resume contract (training/trainer.py:193-194, :247-276), whose key
  ``specforge_model_provenance`` (algorithms/common/providers.py:37) holds the provenance mapping as
  sorted ``(key, value)`` pairs (providers.py:341-344), built at assembly (training/assembly.py:231-241)
  by training/provenance.py:263-292 ``_compute_model_resume_provenance``: the target's and the draft
  config's source identities, revisions, embedding / lm_head keys, ``capture_layers`` (SpecForge's
  numbering), ``input_modality`` and ``torch_dtype``. The file is read with
  ``torch.load(weights_only=True)``: nothing is unpickled.
- the **capture contract** of a run config (``--specforge-config YAML``): training/capture_contract.py:21-68
  ``resolve_server_capture_contract`` (method, aux layer ids, target hidden and vocab sizes, draft vocab
  size), resolved by SpecForge's own ``load_config`` and algorithm registry, as its launcher does for the
  capture servers (launch_plan.py:469, training/disaggregated.py:549-553). SpecForge persists none of it
  in a checkpoint: it is computed from the config at every launch.

Everything is recorded as read (contract field ``specforge_contract``); nothing is filled in. Each value
is checked against what this recording uses (``SpecForgeRecord.facts``), and each disagreement is one
named entry with its fix (``disagreements``), which ``record train`` prints and ``specdiff diff`` reports
as a contract warning of the training side (replay/diff/contract/check.py).
"""

from __future__ import annotations

import contextlib
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from specdiff.eagle3.aux_layers import ConventionError, native_aux_ids, resolve_aux_ids
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.replay.trainers.registry import TRAINERS, trainer_version

__all__ = ["FIELD", "PROVENANCE_KEY", "STATE_FILE", "SpecForgeRecord", "read_specforge"]

#: the contract field (tracer/contract.py)
FIELD = "specforge_contract"
#: SpecForge 0.2.0 training/checkpoint.py:32
STATE_FILE = "training_state.pt"
#: SpecForge 0.2.0 algorithms/common/providers.py:37 MODEL_PROVENANCE_CONTRACT_KEY
PROVENANCE_KEY = "specforge_model_provenance"
#: the payload keys SpecForge writes beside the provenance that say which run and step it is (controller.py:851-865)
_RUN_KEYS = ("run_id", "global_step", "strategy")
#: the capture contract's fields (training/capture_contract.py:13-18)
_CAPTURE_FIELDS = ("method", "aux_layer_ids", "target_hidden_size", "target_vocab_size", "draft_vocab_size")
#: capture-contract size -> the recorded fact it must equal
_SIZES = {"target_hidden_size": "hidden_size", "target_vocab_size": "vocab_size", "draft_vocab_size": "draft_vocab_size"}


def _plain(value):
    """``value`` JSON / msgpack-safe: tuples as lists, mapping keys as str, anything else as its str."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _one_line(e: BaseException) -> str:
    """``Type: message`` on one line; of torch's weights-only refusal, only the unpickler's reason (its advice to
    load with ``weights_only=False`` is not what to do with a file from elsewhere)."""
    text = " ".join(str(e).split())
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split(". Please", 1)[0].split(" Check the doc", 1)[0]
        return f"torch.load(weights_only=True) refuses it: {text.strip()[:160]}; specdiff unpickles no Python object"
    return f"{type(e).__name__}: {text[:200]}"


def _load_state(path: Path, fix: str) -> object:
    """The payload of ``path`` by ``torch.load(weights_only=True)`` (memory-mapped when it is a zip archive,
    as torch.save writes: the draft and optimizer tensors are not read).

    Raises:
        RecordTrainError: torch cannot read it so (a corrupt file, or one holding Python objects).
    """
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:  # noqa: BLE001 - any failure to read is the same one line
        raise RecordTrainError(f"{path}: not a readable SpecForge training state ({_one_line(e)}); {fix}") from None


def _find_state(draft_dir: Path, given) -> tuple[Path, str] | None:
    """(training_state.pt, where it was found) for ``--specforge-checkpoint given`` (a checkpoint directory or
    the file), else the draft directory's or its parent's; None when there is none."""
    if given is not None:
        p = Path(given)
        path = p / STATE_FILE if p.is_dir() else p
        if not path.is_file():
            raise RecordTrainError(f"--specforge-checkpoint {given}: no {STATE_FILE} there; give a SpecForge checkpoint "
                                   f"directory ({{run_id}}-step{{N}}/, SpecForge training/checkpoint.py:55-56) or its "
                                   f"{STATE_FILE}")
        return path, "--specforge-checkpoint"
    for where, d in (("the draft directory", draft_dir), ("the draft directory's parent", draft_dir.parent)):
        if (d / STATE_FILE).is_file():
            return d / STATE_FILE, where
    return None


def read_checkpoint(draft_dir, given=None) -> tuple[dict | None, list[str]]:
    """SpecForge's model provenance of the checkpoint ``--specforge-checkpoint given`` names, or of a
    ``training_state.pt`` found in the draft directory or its parent (module doc).

    Returns:
        ({file, found_in, run_id, global_step, strategy, model_provenance: {key: value as read, JSON-safe}},
        notes), or (None, notes) when no checkpoint is given or found, or a found one holds no provenance
        (a run without a provider-bound contract, SpecForge launch.py:90-103: said in a note).

    Raises:
        RecordTrainError: one line naming the file and what to do: a given path without a training_state.pt,
            a file ``torch.load(weights_only=True)`` cannot read, a payload without provenance when it was
            given, or a provenance that is not (key, value) pairs.
    """
    found = _find_state(Path(draft_dir), given)
    if found is None:
        return None, []
    path, where = found
    fix = ("give the training_state.pt SpecForge saved ({run_id}-step{N}/training_state.pt)" if given is not None
           else f"replace it with the file SpecForge saved, or move it out of {where}")
    state = _load_state(path, fix)
    if not isinstance(state, dict) or PROVENANCE_KEY not in state:
        what = (f"holds no {PROVENANCE_KEY} (SpecForge 0.2.0 writes it for a provider-bound run, "
                "algorithms/common/providers.py:341-344)")
        if given is None:
            return None, [f"{path} ({where}) {what}: no SpecForge provenance read"]
        raise RecordTrainError(f"{path}: {what}; give the training_state.pt of a SpecForge training run, or leave "
                               "--specforge-checkpoint out")
    try:
        provenance = dict(state[PROVENANCE_KEY])
    except (TypeError, ValueError):
        raise RecordTrainError(f"{path}: its {PROVENANCE_KEY} is not (key, value) pairs (SpecForge 0.2.0 writes a tuple "
                               f"of them, providers.py:341-344); {fix}") from None
    record = {"file": str(path.resolve()), "found_in": where, **{k: _plain(state.get(k)) for k in _RUN_KEYS},
              "model_provenance": {str(k): _plain(v) for k, v in sorted(provenance.items())}}
    return record, [f"read SpecForge's model provenance from {path} ({where})"]


def read_capture_contract(config_path) -> dict:
    """SpecForge's capture contract of the run config ``config_path`` (a SpecForge YAML / JSON), resolved by
    SpecForge itself: ``config.load_config``, the algorithm ``training.strategy`` from its built-in registry
    (algorithms/builtin.py), then ``resolve_server_capture_contract`` (training/capture_contract.py:21-68).

    Returns:
        {file, target_model_path, method, aux_layer_ids (SpecForge's numbering), target_hidden_size,
        target_vocab_size, draft_vocab_size}.

    Raises:
        RecordTrainError: SpecForge is not installed (the pip line), the config does not load, is not an
            online run (SpecForge resolves a capture contract only for server capture), or names a target or
            draft config not found here, or SpecForge refuses it.
    """
    t = TRAINERS["specforge"]
    if trainer_version("specforge") is None:
        raise RecordTrainError(f"--specforge-config: SpecForge resolves its capture contract itself and is not "
                               f"installed; run `{t.pip}` (or `make install`)")
    from specforge.algorithms.builtin import builtin_algorithm_registry
    from specforge.config import load_config
    from specforge.training.capture_contract import resolve_server_capture_contract

    where = f"--specforge-config {config_path}"
    try:
        cfg = load_config(str(config_path))
    except Exception as e:  # noqa: BLE001 - a missing file, bad YAML or a pydantic refusal: one line
        raise RecordTrainError(f"{where}: SpecForge cannot load it ({_one_line(e)})") from None
    if cfg.mode != "online":
        raise RecordTrainError(f"{where}: an {cfg.mode} run; SpecForge resolves a capture contract only for online "
                               "server capture (launch_plan.py:469); leave --specforge-config out")
    for key, value in (("target_model_path", cfg.model.target_model_path),
                       ("draft_model_config", cfg.model.draft_model_config)):
        if value and not Path(value).exists():
            raise RecordTrainError(f"{where}: model.{key} {value} is not found here, and SpecForge resolves the capture "
                                   "contract from it (capture_contract.py:32-43); point it at this machine's copy")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # a trace command's stdout is its report
            c = resolve_server_capture_contract(cfg, algorithm=builtin_algorithm_registry().resolve(cfg.training.strategy))
    except Exception as e:  # noqa: BLE001 - SpecForge's own refusal, said in one line
        raise RecordTrainError(f"{where}: SpecForge cannot resolve its capture contract ({_one_line(e)})") from None
    return {"file": str(Path(config_path).resolve()), "target_model_path": cfg.model.target_model_path,
            **{k: _plain(getattr(c, k)) for k in _CAPTURE_FIELDS}}


def _content(identity) -> dict[str, list] | None:
    """File name -> the content-bearing part of its record in a SpecForge directory identity: JSON
    descriptors [size, sha256], weight shards [size]; None for an identity without per-file records
    (a ``reference``: a name that was no local path when SpecForge trained) or another format.

    A shard's ``mtime_ns`` is left out. SpecForge itself keeps it only as an rsync-style quick check, and says
    that content-level identity is pinned by the sha256'd JSON descriptors (config + safetensors index cover the
    shard layout): training/provenance.py:83-98. A copied or re-downloaded target has other mtimes and the same
    bytes, so a difference in mtime alone is not another target. stat-v1 records share the v2 prefix
    (kind, name, size, mtime_ns): provenance.py:339-367.
    """
    if not (isinstance(identity, list) and len(identity) == 3
            and identity[0] in ("directory-stat-v2", "directory-stat-v1") and isinstance(identity[2], list)):
        return None
    out = {}
    for rec in identity[2]:
        if isinstance(rec, list) and len(rec) >= 4:
            out[str(rec[1])] = [rec[2], rec[3]] if rec[0] == "sha256" else [rec[2]]
    return out


def _target_words(saved: dict, current: dict) -> list[str]:
    """Each file whose content-bearing record differs, in words."""
    out = []
    for name in sorted(set(saved) | set(current)):
        a, b = saved.get(name), current.get(name)
        if a is None or b is None:
            out.append(f"{name} only in {'--target' if a is None else 'the checkpoint target'}")
        elif len(a) == 2 and a[1:] != b[1:]:  # a JSON descriptor: its bytes differ
            out.append(f"{name} sha256 {str(a[1])[:12]} vs {str(b[-1])[:12]}")
        elif a != b:
            out.append(f"{name} size {a[0]} vs {b[0]}")
    return out


@dataclass
class SpecForgeRecord:
    """What SpecForge recorded of the run: ``checkpoint`` (``read_checkpoint``) and ``capture_contract``
    (``read_capture_contract``), either None when not read, and the notes of reading them."""

    checkpoint: dict | None = None
    capture_contract: dict | None = None
    notes: list[str] = field(default_factory=list)

    def facts(self, recorded: dict, *, target_dir, num_layers: int) -> tuple[dict, list[str]]:
        """The ``specforge_contract`` fact and the notes ``record train`` prints.

        Args:
            recorded: this recording's contract facts (``aux_concat_order``, ``dtype``, ``hidden_size``,
                ``vocab_size``, ``draft_vocab_size``, ``target_architecture``).
            target_dir: ``--target`` (its SpecForge source identity is recomputed by SpecForge's own
                ``model_source_identity``, training/provenance.py:101-120).
            num_layers: the target's decoder layers L (SpecForge's capture-layer numbering is read by
                eagle3/aux_layers.py ``RULES['specforge']``).

        Returns:
            ({"specforge_contract": {"checkpoint", "capture_contract" (those read), "checked": {fact: what the
            check found}, "disagreements": [{fact, specforge (SpecForge's value), recording (this recording's), message,
            fix}]}}, notes).
        """
        checks = _Checks(recorded, num_layers)
        if self.checkpoint is not None:
            prov = self.checkpoint["model_provenance"]
            name = f"SpecForge checkpoint {self.checkpoint['file']}"
            checks.target(prov.get("target_model"), target_dir, name)
            checks.layers("model_provenance.capture_layers", prov.get("capture_layers"), name)
            checks.dtype(prov.get("torch_dtype"), name)
        if self.capture_contract is not None:
            cc = self.capture_contract
            name = f"SpecForge's capture contract of {cc['file']}"
            checks.layers("capture_contract.aux_layer_ids", cc["aux_layer_ids"], name)
            checks.sizes(cc, name)
        out = {k: v for k, v in (("checkpoint", self.checkpoint), ("capture_contract", self.capture_contract))
               if v is not None}
        if not out:  # a found training_state.pt without provenance: its note only
            return {}, list(self.notes)
        out.update(checked=checks.checked, disagreements=checks.found)
        return {FIELD: out}, [*self.notes, *(f"{FIELD}.{d['fact']}: {d['message']} (fix: {d['fix']})"
                                             for d in checks.found)]


class _Checks:
    """The checks of ``SpecForgeRecord.facts``: each records what it found in ``checked`` and appends a
    disagreement to ``found``."""

    def __init__(self, recorded: dict, num_layers: int):
        self.recorded, self.L = recorded, num_layers
        self.checked: dict[str, str] = {}
        self.found: list[dict] = []

    def _differs(self, fact: str, theirs, ours, message: str, fix: str) -> None:
        self.checked[fact] = "differs"
        self.found.append({"fact": fact, "specforge": theirs, "recording": ours, "message": message, "fix": fix})

    def target(self, saved, target_dir, name: str) -> None:
        fact = "model_provenance.target_model"
        if trainer_version("specforge") is None:
            self.checked[fact] = (f"not checked: SpecForge computes the identity and is not installed here "
                                  f"({TRAINERS['specforge'].pip})")
            return
        from specforge.training.provenance import model_source_identity

        current = _plain(model_source_identity(str(target_dir)))
        a, b = _content(saved), _content(current)
        if a is None:
            kind = saved[0] if isinstance(saved, list) and saved else saved
            self.checked[fact] = (f"not checked: SpecForge recorded the target as {kind!r} ({str(saved)[:80]}), not "
                                  "as a directory's per-file stat records (stat-v1 / stat-v2)")
        elif a == b:
            self.checked[fact] = ("agrees: the same file names, sizes and JSON sha256s (shard mtimes and the "
                                  "directory's path are not compared)")
        else:
            words = _target_words(a, b or {})
            self._differs(fact, saved[1], str(current[1]),
                          f"{name} was trained against another target: {saved[1]} (as SpecForge recorded it) and "
                          f"--target {target_dir} differ: {'; '.join(words[:4])}"
                          + (f" (+{len(words) - 4} more)" if len(words) > 4 else ""),
                          "record training and serve with the target the draft was trained against, or retrain the "
                          "draft on this target (its hidden states are what the draft learned to read)")

    def layers(self, fact: str, ids, name: str) -> None:
        if ids is None:
            self.checked[fact] = "not checked: none recorded (SpecForge resolves them only for online capture)"
            return
        used = self.recorded.get("aux_concat_order")
        try:
            hf = list(resolve_aux_ids(ids, convention="specforge", num_layers=self.L, concat="listed").hf_indices)
        except ConventionError as e:
            self._differs(fact, ids, used, f"{name} names capture layers {ids} that cannot be replayed here: {e}",
                          "record training with layers HF output_hidden_states holds, or retrain")
            return
        if hf == used:
            self.checked[fact] = f"agrees: SpecForge ids {ids} = HF {hf}, in this concat order"
            return
        try:
            serve = (f"; serve them: eagle_config.eagle_aux_hidden_state_layer_ids "
                     f"{native_aux_ids(hf, 'sglang', num_layers=self.L, architecture=self.recorded.get('target_architecture'))} "
                     "in the draft config (SGLang's numbering for this target: SpecForge's exporter does not write its ids)")
        except ConventionError:
            serve = ""
        self._differs(fact, ids, used, f"{name} trained on capture layers {ids} (SpecForge's numbering: output of "
                      f"layer k = HF k+1, so HF {hf} in this concat order); this recording feeds HF {used}",
                      f"record training with the layers it was trained on: --aux-layers {','.join(map(str, ids))} "
                      f"--aux-convention specforge{serve}")

    def dtype(self, trained, name: str) -> None:
        fact, used = "model_provenance.torch_dtype", self.recorded.get("dtype")
        if trained is None:
            self.checked[fact] = "not checked: none recorded"
        elif trained == used:
            self.checked[fact] = f"agrees: {used}"
        else:
            self._differs(fact, trained, used, f"{name} trained the draft in {trained} (model.torch_dtype); this "
                          f"recording computes it in {used}", f"record training with --dtype {trained}")

    def sizes(self, cc: dict, name: str) -> None:
        if cc["method"] != "eagle3":
            self._differs("capture_contract.method", cc["method"], "eagle3", f"{name} captures for method "
                          f"{cc['method']!r}; record train computes an EAGLE-3 draft",
                          "give the config of the EAGLE-3 run this draft was trained by")
        else:
            self.checked["capture_contract.method"] = "agrees: eagle3"
        for key, ours in _SIZES.items():
            fact, used = f"capture_contract.{key}", self.recorded.get(ours)
            if cc[key] == used:
                self.checked[fact] = f"agrees: {used}"
            else:
                self._differs(fact, cc[key], used, f"{name} has {key} {cc[key]}; this recording's {ours} is {used}",
                              "give the run config the draft was trained with, and record with its target and draft")


def read_specforge(draft_dir, *, checkpoint=None, config=None) -> SpecForgeRecord | None:
    """Everything SpecForge recorded of the run that ``record train`` is given or finds (``read_checkpoint``,
    ``read_capture_contract``); None when there is nothing (no option given, no checkpoint found).

    Raises:
        RecordTrainError: one line (``read_checkpoint``, ``read_capture_contract``).
    """
    ckpt, notes = read_checkpoint(draft_dir, checkpoint)
    cc = read_capture_contract(config) if config is not None else None
    if ckpt is None and cc is None and not notes:
        return None
    return SpecForgeRecord(ckpt, cc, notes)
