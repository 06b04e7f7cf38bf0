"""Record a training-side trace: teacher-forced EAGLE-3 TTT forward over token sequences.

Owns the ``record train`` run: options and their defaults, loading the models, the contract
facts, and driving the batches through the background writer. The pieces live beside it:
``sequences`` (what is replayed, batching), ``train_aux`` (the training aux layers),
``replayer`` (the forward and its rows, built by ``tracer.rows``), ``train_side`` (the loaded side:
its contract facts, trace and batches), ``train_facts`` (the contract facts that come from outside
the rows), ``errors``; model loading's dtypes and quiet output are
``replay.model.loading``.

``record_train`` loads the target with transformers (in the serving dtype, bf16 by default, so
tolerances against a serving trace stay tight), loads the draft checkpoint in either format
(``replay.model.checkpoint``), runs the target with all hidden states and the reference draft forward
(``replay.model.draft_model``) on right-padded batches, and writes every canonical tensor
(``tracer.schema``) keyed (seq, pos, depth) with ``iter = -1``:

- ``tokens`` at (t, k) = x_{t+1+k}, the draft input token of every valid row;
- ``target.aux.{j}``, ``target.aux_cat``, ``target.argmax`` (position t predicts x_{t+1});
- ``target.probe.{i}`` for every HF index i in 0..L at the first ``probe_positions`` positions
  (layer-identification evidence for ``specdiff diff``'s explain);
- ``draft.fc_in``, ``draft.fc_out``, ``draft.hidden_in``, ``draft.positions`` (rope position
  t + k), ``draft.attn_in``, ``draft.hidden_out``;
  logits by capture level (``default``: ``draft.logits_topk.{values,ids}`` k=8 and
  ``draft.logsumexp``; ``full``: ``draft.logits``); ``draft.topk``, ``draft.topk_target``;
- ``draft.d2t``: one row per draft id (seq -1, pos i, value d2t[i]);
- ``draft.accept`` (mapped draft argmax == target argmax label at depth k, EAGLE-3 pairing)
  and ``draft.accept_cum`` (accepted at every depth <= k: what a chain draft gets accepted).

Sequences come from a serving trace (``replay``: every served sequence, prompt + generated, with
its prompt_len, rid and seq id, so the two traces align row for row) or from a prompts JSONL.

Aux layers: the *training* layers, i.e. the draft's own configured ids resolved with its
convention, or what the caller states (ids + convention), concatenated in the order listed,
as a trainer does (``tracer.conventions``, concat ``listed``); contract ``aux_concat_order``.
A serving trace's ``aux_hf_indices`` are what the server captured, which is exactly what may be
wrong, so they are never used as the default. An id that names the last decoder layer's output
before the final norm in its convention (GPT-OSS's SGLang id L) is read from the final norm's
input (``train_aux``), contract ``aux_prenorm_indices``.

Target identity: ``target_architecture``, ``target_config_sha256``, ``target_num_experts`` /
``target_experts_per_token`` and ``target_weights_fingerprint`` of the target as loaded
(``tracer.contract.target_identity_facts``, the same computation as the SGLang recorder's), so
``specdiff diff`` refuses a pair recorded on two different targets.

Nothing the caller gives is rewritten: an input that cannot be used as given is refused with
one line (``RecordTrainError``), and every option left unset is filled from
``train_options.DEFAULTS`` or the serving trace and stored, with where it came from, in the
contract field ``defaults_used``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from specdiff.eagle3.aux_layers import CONVENTIONS, AuxResolution, target_architecture
from specdiff.replay.model.checkpoint import LoadedDraft, load_draft
from specdiff.replay.model.loading import DTYPES, quiet_transformers
from specdiff.replay.model.target_capture import (
    load_target,
    target_embedding,
    target_lm_head,
    target_num_layers,
)
from specdiff.replay.record.replayer import LOGITS_TOPK, TrainReplayer
from specdiff.replay.record.sequences import (
    TrainSequence,
    extend_greedy,
    sequences_from_prompts,
    sequences_from_trace,
)
from specdiff.replay.record.specforge_contract import read_specforge
from specdiff.replay.record.train_aux import resolve_train_aux
from specdiff.replay.record.train_options import (
    AUX_CONVENTION_DEFAULT,
    CAPTURE_LEVELS,
    check_aux_convention,
    check_counts,
    check_device,
    fill_defaults,
)
from specdiff.replay.record.train_side import TrainSide
from specdiff.replay.record.train_writer import RecordTrainResult, write_train_trace
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.replay.trainers.registry import DEFAULT_TRAINER, load_trainer_draft, require_trainer

__all__ = ["RecordTrainError", "TrainSequence", "RecordTrainResult", "CAPTURE_LEVELS",
           "LOGITS_TOPK", "sequences_from_trace", "sequences_from_prompts", "resolve_train_aux",
           "TrainReplayer", "TrainSide", "check_train_options", "load_train_side", "record_train"]


def _parse_dtype(name: str, what: str) -> torch.dtype:
    if name not in DTYPES:
        raise RecordTrainError(f"{what} {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


@contextmanager
def _built_at(dtype: torch.dtype):
    """Modules constructed inside are built at ``dtype`` (torch's default floating dtype, put back after).

    ``load_draft`` builds the reference draft at the default dtype and casts it after loading: at float32 a
    draft with its own [V, H] embedding is built at twice its bf16 size first (measured on a random Llama-3-8B
    shape narrowed to 2048 wide, 128,256 vocab, benchmarks/production_train.py --hidden 2048: loading its 0.3 GiB
    bf16 draft took the peak RSS from 0.75 GiB, the target loaded, to 3.52 GiB; built at bf16, to 2.39 GiB).
    Every tensor the load fills comes from the checkpoint or the target, and the rope's inverse frequencies are
    computed in float64 (replay/model/draft_model.py ``rope_inv_freq``), so the loaded draft is the same bit for
    bit (tests/replay/record/test_record_train_memory.py); only a tensor the checkpoint lacks (random, listed in
    ``draft_unloaded``) is drawn at ``dtype``."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _aux_defaults(aux_layers, aux_convention, loaded: LoadedDraft, aux: AuxResolution) -> dict[str, dict]:
    """``defaults_used`` entries for the aux layers / convention the caller left unset."""
    used: dict[str, dict] = {}
    if aux_layers is None:
        c = loaded.config
        if c.eagle_aux_hidden_state_layer_ids is None:
            src = f"no ids in the draft config: the {c.aux_convention} default HF [2, L//2, L-3]"
        else:
            key = ("eagle_aux_hidden_state_layer_ids" if loaded.format == "speculators"
                   else "eagle_config.eagle_aux_hidden_state_layer_ids")
            src = f"the draft config's {key} {c.eagle_aux_hidden_state_layer_ids}, in the order listed"
        used["aux_layers"] = {"value": list(aux.hf_indices), "source": src + " (HF indices, concat order)"}
        used["aux_convention"] = {"value": aux.convention, "source": f"the draft's {loaded.format} format"}
    elif aux_convention is None:
        used["aux_convention"] = {"value": AUX_CONVENTION_DEFAULT, "source": "record train default for --aux-layers"}
    return used


def check_train_options(*, aux_layers=None, aux_convention: str | None = None, steps=None, topk=None,
                        dtype: str | None = None, target_dtype: str | None = None, capture: str | None = None,
                        probe_positions=None, max_new_tokens=None, batch_size=None, replay=None,
                        device: str | None = None, trainer: str | None = None) -> None:
    """Refuse option values ``record train`` (and ``specdiff watch``, which replays the same way)
    cannot use as given, before any model is loaded.

    ``trainer``: ``--trainer``; a trainer whose package is not installed is refused here, the line
    naming its pip command (``replay.trainers.registry``).

    Raises:
        RecordTrainError: one line naming the option.
    """
    check_aux_convention(aux_layers, aux_convention)
    check_counts(steps=steps, topk=topk, probe_positions=probe_positions, max_new_tokens=max_new_tokens,
                  batch_size=batch_size, replay=replay)
    for opt, name in (("--dtype", dtype), ("--target-dtype", target_dtype)):
        if name is not None:
            _parse_dtype(name, opt)
    if capture is not None and capture not in CAPTURE_LEVELS:
        raise RecordTrainError(f"--capture {capture!r}: use one of {', '.join(CAPTURE_LEVELS)}")
    if aux_convention is not None and aux_convention not in CONVENTIONS:
        raise RecordTrainError(f"--aux-convention {aux_convention!r}: use one of {', '.join(CONVENTIONS)}")
    check_device(device)
    if trainer is not None:
        require_trainer(trainer)


def load_train_side(target_dir: str | Path, draft_dir: str | Path, *, served: dict | None = None,
                    aux_layers=None, aux_convention: str | None = None, steps: int | None = None,
                    topk: int | None = None, dtype: str | None = None, target_dtype: str | None = None,
                    capture: str | None = None, probe_positions: int | None = None,
                    max_new_tokens: int | None = None, batch_size: int | None = None,
                    device: str | None = None, extra_defaults: dict | None = None,
                    trainer: str | None = None, draft_window: int | None = None, target=None,
                    aux=None, device_map: str | None = None) -> TrainSide:
    """Load the target and the draft checkpoint and resolve the training aux layers and every
    option left None (``train_options.fill_defaults``; steps / topk from ``served``, the serving
    trace's contract). Options are checked first (``check_train_options``).

    ``extra_defaults``: more ``defaults_used`` entries (how prompts were tokenized).
    ``trainer``: compute the draft forward with this trainer's own model (``replay.trainers``);
    None or ``specdiff``: the reference forward. The reference draft is loaded either way (its
    parsed config and facts are the draft's contract facts). ``draft_window``: ``LoadedDraft.serve_window``.
    ``target``: a target already at hand that holds its hidden states (record_features' ``FeatureTarget``),
    used instead of loading one; ``aux``: its layers (a ``TrainAux``), used instead of resolving the
    training layers (``aux_layers`` / ``aux_convention`` then only said where they came from).
    ``device_map``: load the transformers target with it (``load_target``) instead of moving it to ``device``;
    kept in ``engine_options.device_map``.

    Raises:
        RecordTrainError / CheckpointError / TargetError: one line each.
    """
    check_train_options(aux_layers=aux_layers, aux_convention=aux_convention, steps=steps, topk=topk, dtype=dtype,
                        target_dtype=target_dtype, capture=capture, probe_positions=probe_positions,
                        max_new_tokens=max_new_tokens, batch_size=batch_size, device=device, trainer=trainer)
    served = dict(served or {})
    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    opts, defaults_used = fill_defaults(
        {"steps": steps, "topk": topk, "dtype": dtype, "target_dtype": target_dtype, "capture": capture,
         "probe_positions": probe_positions, "max_new_tokens": max_new_tokens, "batch_size": batch_size,
         "device": device}, served, cuda_available=torch.cuda.is_available())
    ddtype = _parse_dtype(opts["dtype"], "--dtype")
    tdtype = _parse_dtype(opts["target_dtype"], "--target-dtype")

    quiet_transformers()
    if device_map is not None:  # engine_options.device_map: how the target was spread, as given
        opts["device_map"] = device_map
    if target is None and device_map is not None:
        target = load_target(target_dir, dtype=tdtype, device_map=device_map)
    elif target is None:
        target = load_target(target_dir, dtype=tdtype).to(opts["device"])
    L = target_num_layers(target)
    with _built_at(ddtype):
        loaded = load_draft(draft_dir, dtype=ddtype, target_embedding=target_embedding(target),
                            target_lm_head=target_lm_head(target))
    loaded.model.to(opts["device"])  # nn.Module.to moves the module in place
    if draft_window is not None:
        loaded.serve_window(draft_window)
    given_aux, aux = aux, aux or resolve_train_aux(loaded, L, aux_layers, aux_convention,
                                                   architecture=target_architecture(target.config.to_dict()))
    defaults_used = {**({} if given_aux else _aux_defaults(aux_layers, aux_convention, loaded, aux)), **defaults_used,
                     **(extra_defaults or {}),
                     **{f"draft_config.{k}": v for k, v in loaded.config.defaults_used.items()}}
    if int(opts["topk"]) > loaded.config.draft_vocab_size:
        raise RecordTrainError(f"topk {opts['topk']} exceeds the draft vocab {loaded.config.draft_vocab_size}")
    pad_id = getattr(target.config, "pad_token_id", None)
    rep = TrainReplayer(target, loaded.model, aux, steps=int(opts["steps"]), topk=int(opts["topk"]),
                        capture=opts["capture"], probe_positions=int(opts["probe_positions"]),
                        pad_id=int(pad_id) if pad_id is not None else 0)
    side = TrainSide(target_dir, draft_dir, target, loaded, aux, rep, opts, defaults_used, served)
    if trainer not in (None, DEFAULT_TRAINER):
        side.trainer = rep.draft = load_trainer_draft(trainer, target_dir=target_dir, loaded=loaded, dtype=ddtype,
                                                      device=opts["device"], aux_hf_indices=aux.hf_indices)
    return side


def record_train(target_dir: str | Path, draft_dir: str | Path, out: str, *,
                 replay: str | None = None, prompts: str | Path | None = None,
                 aux_layers=None, aux_convention: str | None = None, steps: int | None = None,
                 topk: int | None = None, dtype: str | None = None, target_dtype: str | None = None,
                 capture: str | None = None, probe_positions: int | None = None,
                 max_new_tokens: int | None = None, batch_size: int | None = None,
                 max_batch_tokens: int = 8192, overwrite: bool = False, device: str | None = None,
                 trainer: str | None = None, draft_window: int | None = None, noise_floor: bool = True,
                 specforge_checkpoint=None, specforge_config=None, device_map: str | None = None,
                 progress: Callable[[int], None] | None = None,
                 on_start: Callable[[int, RecordTrainResult], None] | None = None) -> RecordTrainResult:
    """Replay sequences through target + draft and write a training-side trace at ``out``.

    Every option left None takes its value from ``train_options.DEFAULTS`` (or, for steps / topk,
    the serving trace); each such value is in the result's and the contract's ``defaults_used``.

    Args:
        target_dir / draft_dir: local HF target and EAGLE-3 draft checkpoint (either format).
        replay: a serving trace whose sequences (prompt + generated) are replayed, keeping their
            seq ids, prompt_len and rid. Its ``spec_steps`` / ``spec_topk`` are the defaults of
            ``steps`` / ``topk``; its ``aux_hf_indices`` are NOT used (they are what serving did).
        prompts: a JSONL file (``sequences_from_prompts``); ``max_new_tokens`` > 0 extends each
            with the target's greedy continuation (refused with ``replay``).
        aux_layers / aux_convention: the training aux layers in training's concat order (default:
            the draft config's ids, in the order listed); ``aux_convention`` needs ``aux_layers``.
        steps: TTT depths (default: the serving trace's spec_steps, else 3).
        topk: ``draft.topk`` width (default: the serving trace's spec_topk, else 1).
        dtype: draft compute dtype; target_dtype: target dtype (the serving dtype, bf16).
        device: torch device of both models (default: cuda when torch sees one, else cpu:
            ``train_options.default_device``; the contract's ``engine_options.device`` holds it).
        capture: ``default`` (top-8 logits + logsumexp) or ``full`` (all draft logits).
        probe_positions: every HF hidden state is recorded at the first this-many positions.
        progress: called with the number of sequences finished after each batch.
        on_start: called once with (total sequences, a result stub holding aux, notes and
            defaults_used).
        trainer: ``specdiff`` (default, the reference forward), ``specforge`` or ``speculators``:
            the draft built, loaded and run by that trainer's installed package (``replay.trainers``).
        draft_window: the draft attends as SGLang serves it with ``--speculative-draft-window-size``.
        noise_floor: measure the floor a shift is judged against (replay/record/noise_floor.py; False: not).
        specforge_checkpoint / specforge_config: SpecForge's checkpoint and run config to read (specforge_contract).
        device_map: ``from_pretrained``'s device_map for the target (``auto``: spread over devices), as given.

    Raises:
        RecordTrainError / CheckpointError / TargetError / TraceError: one line each.
    """
    if (replay is None) == (prompts is None):
        raise RecordTrainError("give exactly one of --replay SERVE_TRACE or --prompts FILE.jsonl")
    check_train_options(aux_layers=aux_layers, aux_convention=aux_convention, steps=steps, topk=topk, dtype=dtype,
                        target_dtype=target_dtype, capture=capture, probe_positions=probe_positions,
                        max_new_tokens=max_new_tokens, batch_size=batch_size, replay=replay, device=device,
                        trainer=trainer)
    served: dict = {}
    token_defaults: dict[str, dict] = {}
    if replay is not None:
        seqs, served = sequences_from_trace(replay)
    else:
        seqs = sequences_from_prompts(prompts, Path(target_dir), defaults_used=token_defaults)
    if not overwrite and Path(str(out)).exists():
        raise RecordTrainError(f"{out}: already exists; choose another path or pass --overwrite")
    specforge = read_specforge(draft_dir, checkpoint=specforge_checkpoint, config=specforge_config)
    side = load_train_side(target_dir, draft_dir, served=served, aux_layers=aux_layers, aux_convention=aux_convention,
                           steps=steps, topk=topk, dtype=dtype, target_dtype=target_dtype, capture=capture,
                           probe_positions=probe_positions, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           device=device, extra_defaults=token_defaults, trainer=trainer, draft_window=draft_window,
                           device_map=device_map)
    side.specforge = specforge
    if int(side.options["max_new_tokens"]) > 0:
        seqs = extend_greedy(side.target, seqs, int(side.options["max_new_tokens"]))
    return write_train_trace(side, seqs, str(out), replay=replay, overwrite=overwrite,
                             max_batch_tokens=max_batch_tokens, noise_floor=noise_floor, progress=progress,
                             on_start=on_start)
