"""``specdiff fix TRAIN SERVE -o OUT``: write the corrected copy of the served draft the report's cause
calls for; replay/fix/ holds the plans and the writer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specdiff.tui.cli import EXIT_DIVERGED, EXIT_OK, cli, on_interrupt


@cli.command()
@click.argument("train_trace")
@click.argument("serve_trace")
@click.option("-o", "--output", "out", required=True, metavar="OUT",
              help="Folder for the fixed copy of the served draft (refused if it exists, unless --overwrite).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="How the change is printed.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (never the served draft itself).")
@click.option("--verify", is_flag=True,
              help="Then serve OUT on a CPU server of the recorded engine (SGLang, or vLLM from its venv) with "
                   "the recorded target, speculative settings and prompts, record both sides again, diff, and "
                   "print one verdict line (exit as diff: 0 no divergence, 1 still diverges). Minutes.")
@click.option("--workdir", default=None, metavar="DIR",
              help="Where --verify writes its traces and server log (default: OUT-verify beside OUT).")
def fix(train_trace, serve_trace, out, fmt, overwrite, verify, workdir):
    """Diff TRAIN_TRACE with SERVE_TRACE and write what the first divergence's cause calls for: a
    copy of the served draft (the serving contract's draft_name) in OUT with the corrected config
    keys (the aux ids in the engine's numbering, the norm flags) and, where the cause is in the
    weights or buffers (d2t, fc's column blocks, a norm weight), the corrected safetensors; where it is
    a server option (the draft window, the speculative algorithm, an fp16 overflow's dtype), the copy
    unchanged and the options to serve it with. Prints the change as a diff of config keys, tensor names
    and server options. The served draft is never edited.

    Exit code: 0 the fix was written, or nothing diverged ("nothing to fix", nothing written); 1 nothing
    diverged but the pair shows no agreement either (a trace cut off or damaged, or no row compared: diff's
    verdict, nothing written);
    2 no mechanical fix exists (an engine crash, a cause in other weights, a fix that needs the
    trained weights; one line says why), OUT exists, or bad input; 130 interrupted (OUT as it was).
    With --verify: 0 the fix verified (no divergence), 1 the re-served pair still diverges.
    """
    on_interrupt(f"no fixed draft was written; {out} is as it was")
    from specdiff.replay.diff.pipeline import diff_traces  # torch-free CLI start
    from specdiff.replay.fix.plan import plan_fix
    from specdiff.replay.fix.write import FIX_FORMAT, change_json, change_text, check_out, write_fix

    out = Path(out)
    if out.exists() and not overwrite:  # before the diff: refused at once
        raise click.UsageError(f"-o {out} exists; give a new folder or --overwrite")
    report = diff_traces(train_trace, serve_trace)
    plan = plan_fix(report)
    if plan is None and not report.conclusive:  # cut off, damaged or nothing compared: not agreement
        if fmt == "json":
            click.echo(json.dumps({"fix_format": FIX_FORMAT, "cause": None, "out": None, "verdict": report.verdict()}))
        else:
            click.echo(f"nothing to fix found, but the traces do not show agreement: {report.verdict()} "
                       "(nothing written)")
        sys.exit(EXIT_DIVERGED)
    if plan is None:
        if fmt == "json":
            click.echo(json.dumps({"fix_format": FIX_FORMAT, "cause": None, "out": None}))
        else:
            click.echo("nothing to fix: the traces agree within tolerance (nothing written)")
        sys.exit(EXIT_OK)
    check_out(out, plan.source, overwrite=overwrite)
    write_fix(plan, out, overwrite=overwrite)
    change = change_json(plan, out)
    if not verify:
        click.echo(json.dumps(change, indent=2) if fmt == "json" else change_text(plan, out))
        sys.exit(EXIT_OK)
    if fmt != "json":
        click.echo(change_text(plan, out))
    on_interrupt(f"{out} is written; the verification did not finish")
    from specdiff.demo.verify_fix import verify_fix
    from specdiff.eagle3.engines import REGISTRY, SGLANG
    from specdiff.tracer.contract import known

    where = Path(workdir) if workdir else out.parent / f"{out.name}-verify"
    served = report.traces.y if report.traces.y.side == "serve" else report.traces.x
    engine = REGISTRY.get(str(known(served.contract, "engine")), SGLANG).title  # no fact: an SGLang trace
    click.echo(f"verifying: serving {out} on a CPU {engine} server, recording into {where} (minutes)", err=True)
    verdict = verify_fix(report, out, where, cause=plan.cause, options=plan.options)
    if fmt == "json":
        click.echo(json.dumps({**change, "verify": verdict.to_json()}, indent=2))
    else:
        click.echo(verdict.line)
    sys.exit(EXIT_OK if verdict.verified else EXIT_DIVERGED)
