"""``specdiff check --target T --draft D``: pre-flight contract check from the files alone.

Prints what each engine will capture and feed the draft (HF hidden_states indices), then a table
of findings (severity, engine, kind, one line of evidence, fix), each engine's verdict and what
could not be checked. Exit 1 when a finding for a judged engine (the one asked for, else those the
draft is written for: ``eagle3.config_ids.draft_engines``) is an error, 0 otherwise, 2 on input
that cannot be checked (``specdiff: error: ...``).
"""

from __future__ import annotations

import json
import sys
import textwrap
from typing import TYPE_CHECKING

import click

from specdiff.eagle3.aux_layers import CONVENTIONS
from specdiff.eagle3.engines import ENGINES, REGISTRY, SGLANG, VLLM
from specdiff.tui.cli import EXIT_DIVERGED, EXIT_OK, cli

if TYPE_CHECKING:  # the pre-flight reads checkpoints with torch: imported when `check` runs, not for --help
    from specdiff.replay.preflight.check import PreflightReport

#: engine -> how the capture table names it: the engine with the version whose rules apply
_LABEL = {name: spec.label for name, spec in REGISTRY.items()}


def _layers(value: str | None):
    if value is None or value == "":
        return None
    from specdiff.replay.preflight.check import PreflightError

    try:
        return [int(x) for x in value.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise PreflightError(f"--training-layers {value!r}: expected comma-separated ints, e.g. 2,4,5") from None


def _hf(indices, L: int) -> str:
    def lab(i):
        return "embed" if i == 0 else ("final-norm" if i == L else f"out L{i - 1}")
    return "[" + ", ".join(f"{i}={lab(i)}" for i in indices) + "]"


def _status(cap, judged: bool) -> str:
    """The capture line's verdict: ``ok`` / ``CRASH`` / ``FC SKIPPED``; for an engine the draft is
    not for, what would happen there, as information."""
    if judged:
        return {"ok": "ok", "crash": "CRASH", "fc-skipped": "FC SKIPPED"}[cap.outcome]
    return {"ok": "ok", "crash": "would CRASH", "fc-skipped": "would skip fc"}[cap.outcome] + "; not for this engine"


def _table(findings, width: int, *, counted: bool = True) -> list[str]:
    """Findings as table rows (severity, engine, kind, evidence and fix wrapped under it); the severity
    in parentheses where the finding is not ``counted`` (an engine the verdict does not judge)."""
    lines = []
    ind = " " * 41
    for f in findings:
        body = textwrap.wrap(f.message, width=max(40, width - 41)) or [""]
        severity = f.severity if counted else f"({f.severity})"
        lines.append(f"{severity:8s} {f.engine:6s} {f.kind:24s} {body[0]}")
        lines += [ind + b for b in body[1:]]
        if f.fix:
            lines += [ind + b for b in textwrap.wrap("fix: " + f.fix, width=max(40, width - 41))]
    return lines


def _counted(counts: dict) -> str:
    return f"{counts['error']} error(s), {counts['warn']} warning(s), {counts['info']} info"


def _verdict_lines(report: PreflightReport, width: int) -> list[str]:
    """One line per engine with its own verdict, after which engines were judged and why."""
    names = " and ".join(REGISTRY[e].title for e in report.judged)
    why = report.draft_for.why if report.draft_for is not None else ""
    written = " and ".join(REGISTRY[e].title for e in report.draft_for.engines) if report.draft_for else ""
    if len(report.engines) == 1:
        head = f"verdict for {names}, the engine asked for (--engine {report.engines[0]})"
        if report.draft_for is not None and report.engines[0] not in report.draft_for.engines:
            head += f"; the draft is written for {written} ({why})"
    else:
        what = "engines" if len(report.judged) > 1 else "engine"
        head = f"verdict for {names}, the {what} the draft is written for" + (f" ({why})" if why else "")
    lines = textwrap.wrap(head, width=width, subsequent_indent="  ")
    for eng, v in report.verdicts().items():
        if v.judged:
            lines.append(f"  {_LABEL[eng]:14s} {'ok' if v.outcome == 'ok' else 'FAILS'}: {_counted(v.counts)}")
            continue
        cap = report.captures.get(eng)
        what = ("cannot load this checkpoint" if cap is not None and cap.outcome == "unsupported" else
                f"{v.counts['error']} error(s) if served there" if v.counts["error"]
                else "no error if served there")
        lines.append(f"  {_LABEL[eng]:14s} not for this engine (information): {what}; --engine {eng} judges it")
    return lines


def render_text(report: PreflightReport, *, width: int = 110) -> str:
    """Plain-text report: header, per-engine capture, the findings that set the verdict, then each
    engine the draft is not for (information), what was not checked, each engine's verdict, summary."""
    t, d = report.target, report.draft
    L = t.num_layers
    c = d.config
    judged = report.verdicts()
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
            pre = f" + pre-norm out L{L - 1}" if cap.prenorm_ids else ""
            lines.append(f"  {_LABEL[eng]:14s} {src:34s} -> HF {_hf(cap.hf_indices, L)}{pre}{drop}  "
                         f"[{cap.slots}/{cap.slots_expected} slots, {_status(cap, judged[eng].judged)}]")
        if report.training_hf is not None:
            lines.append(f"  {'training':14s} {'':34s} -> HF {_hf(report.training_hf, L)}")
    counted = [f for f in report.findings if report.judges(f)]
    if counted:
        lines += ["", f"{'SEVERITY':8s} {'ENGINE':6s} {'KIND':24s} EVIDENCE / fix", *_table(counted, width)]
    for eng, v in judged.items():
        own = [f for f in report.findings if f.engine == eng and not v.judged]
        if own:
            lines += [""] + textwrap.wrap(
                f"{_LABEL[eng]}: not for this engine; what would break if the draft were served there (information, "
                f"not counted: the severity in parentheses is what it would be there; --engine {eng} judges it):",
                width=width, subsequent_indent="  ") + _table(own, width, counted=False)
    if report.unchecked:
        lines.append("")
        for u in report.unchecked:
            lines += textwrap.wrap(f"not checked: {u.message}", width=width, subsequent_indent="  ")
    uncounted = [f"{_LABEL[e]} {_counted(v.counts)}" for e, v in judged.items() if not v.judged and any(v.counts.values())]
    lines += ["", *_verdict_lines(report, width), "",
              _counted(report.counts) + (f" (not counted, information: {'; '.join(uncounted)})" if uncounted else "")]
    return "\n".join(lines)


@cli.command()
@click.option("--target", "target", required=True, help="target model directory (config.json; weights not loaded)")
@click.option("--draft", "draft", required=True, help="EAGLE-3 draft checkpoint directory")
@click.option("--engine", type=click.Choice([*ENGINES, "all"]), default="all", show_default=True,
              help="engine(s) whose loading rules to apply; the verdict and exit code follow the engine asked "
                   "for, or with all, the engine(s) the draft's config is written for (SGLang: ids in eagle_config; "
                   "vLLM: top-level ids, dflash_config or the speculators layout; neither: both), the other "
                   "engine's findings shown as information, not failing the check. "
                   f"sglang: {SGLANG.label} reads the aux ids only from "
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
    finding for an engine judged is an error (serving will crash or be wrong), 0 otherwise: the
    engine asked for with --engine, else the one(s) the draft's config is written for; an engine the
    draft is not for gets its line and findings as information. Without --training-layers it says
    that whether the aux layers are the trained ones was not checked. Each engine's advice is in
    its own key and numbering: --engine vllm says which config key vLLM takes the aux ids from,
    what an SGLang-format draft (eagle_config ids with -1) does there, and where the ids to write
    at the top level go.
    """
    from specdiff.replay.preflight.check import run_preflight

    engines = ENGINES if engine == "all" else (engine,)
    report = run_preflight(target, draft, engines=engines, training_layers=_layers(training_layers),
                           training_convention=training_convention,
                           speculative_algorithm=speculative_algorithm)
    if fmt == "json":
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(render_text(report))
    sys.exit(EXIT_DIVERGED if report.failing else EXIT_OK)
