"""``specdiff check --target T --draft D``: pre-flight contract check from the files alone.

Prints what each engine will capture and feed the draft (HF hidden_states indices), then a table
of findings (severity, engine, kind, one line of evidence, fix). Exit 1 when any finding is an
error, 0 otherwise, 2 on input that cannot be checked (``specdiff: error: ...``).
"""

from __future__ import annotations

import json
import sys
import textwrap

import click

from specdiff.eagle3.aux_layers import CONVENTIONS
from specdiff.eagle3.engines import ENGINES, REGISTRY, SGLANG, VLLM
from specdiff.replay.preflight.check import PreflightError, PreflightReport, run_preflight
from specdiff.tui.cli import EXIT_DIVERGED, EXIT_OK, cli

#: engine -> how the capture table names it: the engine with the version whose rules apply
_LABEL = {name: spec.label for name, spec in REGISTRY.items()}


def _layers(value: str | None):
    if value is None or value == "":
        return None
    try:
        return [int(x) for x in value.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise PreflightError(f"--training-layers {value!r}: expected comma-separated ints, e.g. 2,4,5") from None


def _hf(indices, L: int) -> str:
    def lab(i):
        return "embed" if i == 0 else ("final-norm" if i == L else f"out L{i - 1}")
    return "[" + ", ".join(f"{i}={lab(i)}" for i in indices) + "]"


def render_text(report: PreflightReport, *, width: int = 110) -> str:
    """Plain-text report: header, per-engine capture, findings table, summary line."""
    t, d = report.target, report.draft
    L = t.num_layers
    c = d.config
    lines = [f"target  {t.path}   L={L} H={t.hidden_size} V={t.vocab_size}"]
    if c is not None:
        lines.append(f"draft   {d.path}   format {d.format}  Hd={c.hidden_size} Vd={c.draft_vocab_size} "
                     f"K={c.num_aux}")
    else:
        lines.append(f"draft   {d.path}   architectures {d.raw.get('architectures')}")
    if report.captures:
        lines.append("aux capture (HF hidden_states indices, in concat order):")
        for eng, cap in report.captures.items():
            if cap.outcome == "unsupported":
                lines.append(f"  {_LABEL[eng]:14s} cannot load this checkpoint format")
                continue
            src = ("default" if cap.native_ids is None
                   else f"{cap.source} ids {list(cap.native_ids)}")
            drop = f"  dropped ids {list(cap.dropped_ids)}" if cap.dropped_ids else ""
            status = {"ok": "ok", "crash": "CRASH", "fc-skipped": "FC SKIPPED"}[cap.outcome]
            pre = f" + pre-norm out L{L - 1}" if cap.prenorm_ids else ""
            lines.append(f"  {_LABEL[eng]:14s} {src:34s} -> HF {_hf(cap.hf_indices, L)}{pre}{drop}  "
                         f"[{cap.slots}/{cap.slots_expected} slots, {status}]")
        if report.training_hf is not None:
            lines.append(f"  {'training':14s} {'':34s} -> HF {_hf(report.training_hf, L)}")
    counts = {s: sum(f.severity == s for f in report.findings) for s in ("error", "warn", "info")}
    if report.findings:
        lines.append("")
        lines.append(f"{'SEVERITY':8s} {'ENGINE':6s} {'KIND':24s} EVIDENCE / fix")
        ind = " " * 41
        for f in report.findings:
            body = textwrap.wrap(f.message, width=max(40, width - 41)) or [""]
            lines.append(f"{f.severity:8s} {f.engine:6s} {f.kind:24s} {body[0]}")
            lines += [ind + b for b in body[1:]]
            if f.fix:
                fix = textwrap.wrap("fix: " + f.fix, width=max(40, width - 41))
                lines += [ind + b for b in fix]
    lines.append("")
    lines.append(f"{counts['error']} error(s), {counts['warn']} warning(s), {counts['info']} info")
    return "\n".join(lines)


@cli.command()
@click.option("--target", "target", required=True, help="target model directory (config.json; weights not loaded)")
@click.option("--draft", "draft", required=True, help="EAGLE-3 draft checkpoint directory")
@click.option("--engine", type=click.Choice([*ENGINES, "all"]), default="all", show_default=True,
              help=f"engine(s) whose loading rules to apply. sglang: {SGLANG.label} reads the aux ids only from "
                   "eagle_config.eagle_aux_hidden_state_layer_ids, id k captures HF k+1 (-1 = embeddings; the rule "
                   f"depends on the target's model file). vllm: {VLLM.label}'s V1 runner reads the top-level "
                   "eagle_aux_hidden_state_layer_ids first, else eagle_config's, else dflash_config's, else its "
                   "default layers [2, L//2, L-3] (silently); id k = HF k, ascending; what the V2 runner (the GPU "
                   "default, which never reads eagle_config's ids) would take differently is a finding too.")
@click.option("--training-layers", default=None,
              help="layers the draft was trained on, comma-separated (HF indices unless --training-convention)")
@click.option("--training-convention", type=click.Choice(list(CONVENTIONS)),
              default="hf", show_default=True, help="convention of --training-layers")
@click.option("--speculative-algorithm", default="EAGLE3", show_default=True,
              help="the algorithm you will serve with (EAGLE3, EAGLE, ...)")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def check(target, draft, engine, training_layers, training_convention, speculative_algorithm, fmt):
    """Pre-flight: what SGLang / vLLM will really feed this draft, and what will go wrong.

    Reads config.json files, safetensors headers and the draft's d2t / t2d only. Exit 1 when a
    finding is an error (serving will crash or be wrong), 0 otherwise. Each engine's advice is in
    its own key and numbering: --engine vllm says which config key vLLM takes the aux ids from,
    what an SGLang-format draft (eagle_config ids with -1) does there, and where the ids to write
    at the top level go.
    """
    engines = ENGINES if engine == "all" else (engine,)
    report = run_preflight(target, draft, engines=engines, training_layers=_layers(training_layers),
                           training_convention=training_convention,
                           speculative_algorithm=speculative_algorithm)
    if fmt == "json":
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(render_text(report))
    sys.exit(EXIT_DIVERGED if report.errors else EXIT_OK)
