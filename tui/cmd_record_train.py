"""``specdiff record train``: replay token sequences through target + draft (teacher-forced TTT)
and write a training-side trace with the same schema as the serving side."""

from __future__ import annotations

import sys

import click

from specdiff.tracer.conventions import CONVENTIONS

from .cmd_record import record


def _parse_layers(value: str | None):
    if value is None:
        return None
    try:
        return [int(v) for v in value.replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 0,3,6") from None


def _fmt(xs) -> str:
    return "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"


@record.command("train")
@click.option("--target", "target", required=True, type=click.Path(file_okay=False),
              help="Local Hugging Face target model directory.")
@click.option("--draft", "draft", required=True, type=click.Path(file_okay=False),
              help="EAGLE-3 draft checkpoint (SpecForge/SGLang or speculators format).")
@click.option("--replay", "replay", default=None, metavar="SERVE_TRACE",
              help="Replay every sequence (prompt + generated) of this serving trace (aligns row for row).")
@click.option("--prompts", "prompts", default=None, type=click.Path(dir_okay=False),
              help="JSONL: input_ids / text / prompt(+completion) / messages per line.")
@click.option("-o", "--out", "out", required=True, metavar="PATH", help="Trace store to create.")
@click.option("--aux-layers", default=None, metavar="IDS",
              help="Training aux layers, e.g. 0,3,6 (default: the draft config's ids, in its convention).")
@click.option("--aux-convention", type=click.Choice(list(CONVENTIONS)), default=None,
              help="Convention of --aux-layers (default: hf = output_hidden_states index).")
@click.option("--steps", type=int, default=None,
              help="TTT depths (default: the serving trace's spec_steps, else 3).")
@click.option("--topk", type=int, default=None, help="draft.topk width (default: serving spec_topk, else 1).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float32", "float16"]), default="bfloat16",
              show_default=True, help="Draft compute dtype.")
@click.option("--target-dtype", type=click.Choice(["bfloat16", "float32", "float16"]), default="bfloat16",
              show_default=True, help="Target dtype (keep the serving dtype for tight tolerances).")
@click.option("--capture", type=click.Choice(["default", "full"]), default="default", show_default=True,
              help="default: draft logits as top-8 + logsumexp; full: all draft logits.")
@click.option("--probe-positions", type=int, default=64, show_default=True,
              help="Record every target layer at the first N positions (layer identification; 0 = off).")
@click.option("--max-new-tokens", type=int, default=0, show_default=True,
              help="With --prompts: extend each prompt with the target's greedy continuation.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Sequences per forward.")
@click.option("--device", default="cpu", show_default=True, help="torch device for both models.")
@click.option("--overwrite", is_flag=True, help="Replace an existing trace at --out.")
def train(target, draft, replay, prompts, out, aux_layers, aux_convention, steps, topk, dtype, target_dtype,
          capture, probe_positions, max_new_tokens, batch_size, device, overwrite):
    """Record the training side: teacher-forced EAGLE-3 TTT forward of the draft on token sequences.

    \b
    Example (the usual use: the sequences a server produced):
      specdiff record train --target T --draft D --replay serve.trace -o train.trace
      specdiff diff train.trace serve.trace
    """
    from specdiff.replay.record_train import record_train

    bar = {}

    def on_start(total, result):
        aux = result.aux
        src = (f"--aux-layers {aux.ids} ({aux.convention})" if aux_layers is not None
               else f"draft config ids {list(aux.ids) if aux.ids is not None else 'default'} ({aux.convention})")
        click.echo(f"aux layers: HF {list(aux.hf_indices)} from {src}", err=True)
        bar["bar"] = click.progressbar(length=total, label="replaying sequences", file=sys.stderr)
        bar["bar"].__enter__()

    def progress(n):
        bar["bar"].update(n)

    try:
        res = record_train(target, draft, out, replay=replay, prompts=prompts,
                           aux_layers=_parse_layers(aux_layers), aux_convention=aux_convention, steps=steps,
                           topk=topk, dtype=dtype, target_dtype=target_dtype, capture=capture,
                           probe_positions=probe_positions, max_new_tokens=max_new_tokens,
                           batch_size=batch_size, device=device, overwrite=overwrite,
                           progress=progress, on_start=on_start)
    finally:
        if "bar" in bar:
            bar["bar"].__exit__(None, None, None)
    click.echo(f"wrote {res.path}: {res.sequences} sequences, {res.positions} positions in {res.seconds:.1f}s")
    click.echo(f"per-depth acceptance {_fmt(res.accept_rate)}, cumulative {_fmt(res.accept_cum_rate)}, "
               f"mean accept length {res.mean_accept_length:.2f} (chain, incl. bonus token)")
    for note in res.notes:
        click.echo(f"note: {note}", err=True)
