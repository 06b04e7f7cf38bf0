"""``specdiff record train``: replay token sequences through target + draft (teacher-forced TTT)
and write a training-side trace with the same schema as the serving side."""

from __future__ import annotations

import os
import shutil
import sys
import time

import click

from specdiff.eagle3.aux_layers import CONVENTIONS
from specdiff.replay.record.train_options import (
    AUX_CONVENTION_DEFAULT,
    CAPTURE_LEVELS,
    DEFAULTS,
    DEVICE_DEFAULT,
    DTYPE_NAMES,
    FALLBACK_STEPS,
    FALLBACK_TOPK,
    IN_PROCESS_BACKEND,
    TARGET_BACKENDS,
    check_backend,
    check_device,
    check_usage,
    describe_defaults,
)
from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.cli import CAPTURE_HELP, on_interrupt
from specdiff.tui.cmd_record import record


def _parse_layers(value: str | None):
    """The ids exactly as listed (order and all); an empty item is refused, not skipped."""
    if value is None:
        return None
    items = value.replace(" ", "").split(",")
    if items and items[-1] == "" and len(items) > 1:
        items = items[:-1]  # a trailing comma adds nothing
    try:
        return [int(v) for v in items]
    except ValueError:
        raise SpecdiffError(f"--aux-layers {value!r}: expected comma-separated integers in training's "
                            "concat order, e.g. 6,0,3") from None


def _fmt(xs) -> str:
    return "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"


def _drop_partial(out: str, *, existed: bool, since: float) -> str:
    """After an interrupted ``record train``: remove the trace this run began at ``out`` (closed by
    the writer with only the rows replayed so far, it would read as a complete trace); a trace
    that was there before and never reached (``--overwrite``, interrupted while loading) is
    kept. Returns what happened, for the ``interrupted:`` line."""
    marker = os.path.join(out, "zarr.json")
    ours = os.path.isfile(marker) and (not existed or os.path.getmtime(marker) >= since)
    if "://" in out or not ours:
        return f"{out} was not written" + ("; the trace that was there is unchanged" if existed else "")
    shutil.rmtree(out, ignore_errors=True)
    return f"{out} was not written (the partial trace of this run was removed)"


#: ``--trainer`` names (replay/trainers/registry.py TRAINERS, which imports torch: the CLI starts without
#: it; tests/replay/trainers/test_trainers.py holds the two equal)
TRAINER_NAMES = ("specdiff", "specforge", "speculators")

#: k of the training side's draft.logits_topk.* (tracer/rows.py TOPK_WIDTH, which imports torch: the CLI
#: starts without it; tests/replay/diff/test_report_text.py holds the two equal)
TRAIN_TOPK = 8

@record.command("train")
@click.option("--target", "target", required=True, type=click.Path(file_okay=False),
              help="Local Hugging Face target model directory.")
@click.option("--draft", "draft", required=True, type=click.Path(file_okay=False),
              help="EAGLE-3 draft checkpoint (SpecForge/SGLang or speculators format).")
@click.option("--replay", "replay", default=None, metavar="SERVE_TRACE",
              help="Replay every sequence (prompt + generated) of this serving trace (aligns row for row).")
@click.option("--prompts", "prompts", default=None, type=click.Path(dir_okay=False),
              help="JSONL: input_ids / text / prompt(+completion) / messages per line.")
@click.option("--features", "features", default=None, metavar="DIR",
              help="A trainer's stored features as the training side, no target run: SpecForge's offline *.ckpt / "
                   "*.ckpt.gz files or speculators' hs_{i}.safetensors (in DIR or DIR/hidden_states), recognised by "
                   "their names. tokens and target.aux.* are the stored tensors, the draft stages the draft's forward "
                   "on them; --target is read for its config, embedding, lm_head and final norm only. The layers "
                   "the files hold: --aux-layers, else SpecForge's records (--specforge-config of the offline run, "
                   "--specforge-checkpoint); speculators keeps none, so give --aux-layers IDS --aux-convention vllm.")
@click.option("--max-samples", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --features: the first N stored samples (the trainer's order). Default: all.")
@click.option("-o", "--out", "out", required=True, metavar="PATH", help="Trace store to create.")
@click.option("--aux-layers", default=None, metavar="IDS",
              help="Training aux layers in training's concat order, e.g. 6,0,3 (slot j = the j-th id; "
                   "used as given). Default: the draft config's ids, in its convention and order. With --features: "
                   "the layers the stored files hold, in their concat order.")
@click.option("--aux-convention", type=click.Choice(list(CONVENTIONS)), default=None,
              show_default=f"{AUX_CONVENTION_DEFAULT}, the output_hidden_states index",
              help="Convention of --aux-layers.")
@click.option("--steps", type=int, default=None,
              show_default=f"the serving trace's spec_steps, else {FALLBACK_STEPS}", help="TTT depths.")
@click.option("--topk", type=int, default=None,
              show_default=f"the serving trace's spec_topk, else {FALLBACK_TOPK}", help="draft.topk width.")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default=None,
              show_default=DEFAULTS["dtype"], help="Draft compute dtype.")
@click.option("--target-dtype", type=click.Choice(DTYPE_NAMES), default=None,
              show_default=DEFAULTS["target_dtype"], help="Target dtype; keep the serving dtype for tight tolerances.")
@click.option("--capture", type=click.Choice(CAPTURE_LEVELS), default=None,
              show_default=DEFAULTS["capture"], help=CAPTURE_HELP.format(k=TRAIN_TOPK))
@click.option("--probe-positions", type=int, default=None,
              show_default=str(DEFAULTS["probe_positions"]),
              help="Record every target layer at the first N positions (layer identification; 0 = off).")
@click.option("--max-new-tokens", type=int, default=None,
              show_default=str(DEFAULTS["max_new_tokens"]),
              help="With --prompts: extend each prompt with the target's greedy continuation.")
@click.option("--batch-size", type=int, default=None,
              show_default=str(DEFAULTS["batch_size"]), help="Sequences per forward.")
@click.option("--device", default=None, show_default=DEVICE_DEFAULT,
              help="torch device for both models (the trace's engine_options.device says which was used).")
@click.option("--trainer", type=click.Choice(TRAINER_NAMES), default=None, show_default="specdiff",
              help="Whose draft forward is the training side: specdiff's reference, or the draft built, loaded "
                   "and run by the installed SpecForge / speculators package.")
@click.option("--draft-window", type=click.IntRange(min=1), default=None, metavar="W",
              help="Attend as SGLang serves the draft with --speculative-draft-window-size W (every layer sees the "
                   "last W+1 entries of its KV sequence, draft tokens included). Default: the draft config's "
                   "layer_types / sliding_window (speculators' rule), else full attention.")
@click.option("--noise-floor/--no-noise-floor", default=True, show_default=True,
              help="Re-run the forward once on the first sequences (<= 256 tokens) at the other precision and "
                   "record each stage's bf16-vs-float32 gap: the floor `diff` judges a systematic shift against. "
                   "Off: the pair is judged by its fixed tolerances alone.")
@click.option("--specforge-checkpoint", default=None, metavar="PATH",
              help="The SpecForge checkpoint the draft comes from ({run_id}-step{N}/ or its training_state.pt): its "
                   "model provenance (target, capture layers, dtype) is recorded and checked against this recording, "
                   "each disagreement a named warning. Default: the training_state.pt in the draft directory or its "
                   "parent, when one holds SpecForge's provenance.")
@click.option("--specforge-config", default=None, metavar="YAML",
              help="The SpecForge run config the draft was trained with: SpecForge resolves its capture contract "
                   "(method, aux layer ids, target and draft sizes), recorded and checked like the provenance. With "
                   "--features: the offline run's config, whose capture layers SpecForge resolves as "
                   "prepare_hidden_states.py captured them.")
@click.option("--target-backend", type=click.Choice(TARGET_BACKENDS), default=IN_PROCESS_BACKEND, show_default=True,
              help="Where the target forward runs: transformers in this process, or sglang: SGLang's own engine "
                   "(a server on --device; the CPU recipe on cpu) capturing the training layers through the "
                   "model's set_eagle3_layers_to_capture, for a target that needs its parallel settings.")
@click.option("--tp-size", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --target-backend sglang: SGLang's --tp-size, passed as given.")
@click.option("--engine-args", default=None, metavar="ARGS",
              help="With --target-backend sglang: more SGLang server arguments, passed as given "
                   "(e.g. \"--ep-size 8 --mem-fraction-static 0.8\").")
@click.option("--device-map", default=None, metavar="MAP",
              help="With the transformers backend: from_pretrained's device_map (auto spreads the target over "
                   "the devices), as given; recorded in engine_options.device_map.")
@click.option("--overwrite", is_flag=True, help="Replace an existing trace at --out.")
def train(target, draft, replay, prompts, features, max_samples, out, aux_layers, aux_convention, steps, topk, dtype, target_dtype,
          capture, probe_positions, max_new_tokens, batch_size, device, trainer, draft_window, noise_floor,
          specforge_checkpoint, specforge_config, target_backend, tp_size, engine_args, device_map, overwrite):
    """Record the training side: teacher-forced EAGLE-3 TTT forward of the draft on token sequences.

    Exit code: 0 written, 2 bad input, 130 interrupted (the partial trace is removed: a trace at
    --out is always a whole run).

    \b
    Example (the usual use: the sequences a server produced):
      specdiff record train --target T --draft D --replay serve.trace -o train.trace
      specdiff diff train.trace serve.trace

    \b
    From a trainer's stored features (any target size: only the draft runs):
      specdiff record train --target T --draft D --features DIR -o features.trace
      specdiff record client --url URL --prompts-from-features DIR   # serve the stored sequences
      specdiff diff features.trace serve.trace
      specdiff record train --target T --draft D --replay features.trace -o replay.trace
      specdiff diff replay.trace features.trace   # are the stored features what the target computes?
    """
    on_interrupt(f"{out} was not written")
    # what the command line alone shows is wrong is said before torch and transformers load (seconds)
    aux_ids = _parse_layers(aux_layers)
    check_usage(replay=replay, prompts=prompts, features=features, max_samples=max_samples, aux_layers=aux_ids,
                aux_convention=aux_convention, steps=steps, topk=topk, probe_positions=probe_positions,
                max_new_tokens=max_new_tokens, batch_size=batch_size, target_dtype=target_dtype, out=out,
                overwrite=overwrite)
    check_backend(backend=target_backend, features=features, tp_size=tp_size, engine_args=engine_args,
                  device_map=device_map, probe_positions=probe_positions, max_new_tokens=max_new_tokens,
                  specforge=specforge_checkpoint or specforge_config)
    check_device(device)  # torch alone, not the model stack
    existed, since = os.path.exists(out), time.time() - 1  # 1 s: a filesystem's coarse mtimes
    bar = {}

    def on_start(total, result):
        aux = result.aux
        ids = list(aux.ids) if aux.ids is not None else "default"
        src = (f"--aux-layers {ids} ({aux.convention})" if aux_layers is not None
               else f"the features' records, ids {ids} ({aux.convention}; note features: says which)"
               if features is not None else f"draft config ids {ids} ({aux.convention})")
        click.echo(f"aux layers: HF {list(aux.hf_indices)} in this concat order (slot j = the j-th) "
                   f"from {src}", err=True)
        if result.defaults_used:
            click.echo(f"defaults used: {describe_defaults(result.defaults_used)}", err=True)
        bar["bar"] = click.progressbar(length=total, label="replaying sequences", file=sys.stderr)
        bar["bar"].__enter__()

    def progress(n):
        bar["bar"].update(n)

    try:
        if features is not None:
            from specdiff.replay.record.record_features import record_features

            res = record_features(features, target, draft, out, aux_layers=aux_ids,
                                  aux_convention=aux_convention, specforge_checkpoint=specforge_checkpoint,
                                  specforge_config=specforge_config, max_samples=max_samples, steps=steps,
                                  topk=topk, dtype=dtype, capture=capture, batch_size=batch_size, device=device,
                                  trainer=trainer, draft_window=draft_window, noise_floor=noise_floor,
                                  overwrite=overwrite, progress=progress, on_start=on_start)
        elif target_backend != IN_PROCESS_BACKEND:
            import torch

            from specdiff.replay.record.engine_target import EngineSettings
            from specdiff.replay.record.record_engine import record_engine
            from specdiff.replay.record.train_options import default_device

            dev = device or default_device(torch.cuda.is_available())["value"]
            settings = EngineSettings.parse(tp_size=tp_size, engine_args=engine_args, device=dev)
            res = record_engine(target, draft, out, replay=replay, prompts=prompts, settings=settings,
                                aux_layers=aux_ids, aux_convention=aux_convention, steps=steps, topk=topk,
                                dtype=dtype, target_dtype=target_dtype, capture=capture, batch_size=batch_size,
                                trainer=trainer, draft_window=draft_window, noise_floor=noise_floor,
                                overwrite=overwrite, progress=progress, on_start=on_start)
        else:
            from specdiff.replay.record.record_train import record_train

            res = record_train(target, draft, out, replay=replay, prompts=prompts,
                               aux_layers=aux_ids, aux_convention=aux_convention, steps=steps,
                               topk=topk, dtype=dtype, target_dtype=target_dtype, capture=capture,
                               probe_positions=probe_positions, max_new_tokens=max_new_tokens,
                               batch_size=batch_size, device=device, overwrite=overwrite, trainer=trainer,
                               draft_window=draft_window, noise_floor=noise_floor,
                               specforge_checkpoint=specforge_checkpoint, specforge_config=specforge_config,
                               device_map=device_map, progress=progress, on_start=on_start)
    except KeyboardInterrupt:
        on_interrupt(_drop_partial(out, existed=existed, since=since))
        raise
    finally:
        if "bar" in bar:
            bar["bar"].__exit__(None, None, None)
    click.echo(f"wrote {res.path}: {res.sequences} sequences, {res.positions} positions in {res.seconds:.1f}s")
    click.echo(f"per-depth acceptance {_fmt(res.accept_rate)}, cumulative {_fmt(res.accept_cum_rate)}, "
               f"mean accept length {res.mean_accept_length:.2f} (chain, incl. bonus token)")
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
