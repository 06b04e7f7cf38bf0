"""``specdiff diff A B``: the differential report (text or JSON), on a terminal too; the app is
``specdiff view A B`` (the README calls diff a report, so a terminal does not make it open the app)."""

from __future__ import annotations

import sys
from contextlib import nullcontext

import click

from specdiff.replay.diff.measure.tolerance import PRESETS, parse_overrides
from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.cli import EXIT_DIVERGED, EXIT_OK, cli, on_interrupt, refuse_the_same_trace


@cli.command()
@click.argument("trace_a")
@click.argument("trace_b")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Report format (the interactive app is `specdiff view A B`).")
@click.option("-o", "--output", "output", default=None, metavar="FILE",
              help="Write the report to FILE instead of stdout, whole or not at all (an interrupted or failed "
                   "run leaves FILE as it was).")
@click.option("--preset", type=click.Choice(list(PRESETS)), default="default", show_default=True,
              help="Tolerance preset: strict (x0.2), default (dtype-aware), loose (x5).")
@click.option("--tol", "tol", multiple=True, metavar="STAGE=rel:X,cos:Y",
              help="Override a stage's or tensor's tolerance, e.g. --tol draft.fc_out=rel:0.1 (repeatable).")
@click.option("--graft", is_flag=True,
              help="Re-run the training-side draft on serving's inputs, substituting one training input "
                   "at a time, and rank how much of the acceptance gap each recovers (loads torch).")
@click.option("--draft", "draft_dir", default=None, metavar="DIR",
              help="The draft checkpoint as trained, for every re-run of the training draft: narrowing an "
                   "unexplained divergence, the attention-context proof and --graft (default: the training "
                   "contract's draft_name).")
@click.option("--target", "target_dir", default=None, metavar="DIR",
              help="The target, when the draft shares its embedding, for the same re-runs "
                   "(default: the training contract's model_name).")
@click.option("--no-narrow", is_flag=True,
              help="Never re-run the training draft: not to narrow a divergence no explanation fits (serving's "
                   "inputs grafted in), nor to show that later draft rows only carry an earlier differing "
                   "cached row when too few rows precede it (those rows then count).")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Compute the per-chunk metrics on a local Dask cluster of N worker processes "
                   "(the same report; needs dask.distributed).")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Compute the per-chunk metrics on the running Dask scheduler at ADDRESS "
                   "(tcp://host:8786); its workers read the traces at the paths/URLs given.")
def diff(trace_a, trace_b, fmt, output, preset, tol, graft, draft_dir, target_dir, no_narrow, workers,
         dask_address):
    """Align TRACE_A (usually training) with TRACE_B (usually serving) and report the first divergence.

    Leads with the first diverging tensor and its explanation, then the contract mismatches,
    then acceptance on both sides. A damaged chunk costs only its own rows (marked unreadable; each
    damaged part is one line under "damage"; a trace its writer never closed is named in the first
    line). Exit code: 0 equivalent within tolerance, 1 a divergence was found, recorded rows could
    not be read or a trace was cut off (not closed), 2 bad input, 130 interrupted (no report written).

    The report is printed on a terminal too; `specdiff view A B` opens the app on the same pair.
    With --workers or --dask the chunks are compared on Dask workers straight from the stores;
    only the small per-chunk results come back.
    """
    on_interrupt("no report was written" + (f"; {output} is as it was" if output else ""))
    overrides = parse_overrides(tol)
    refuse_the_same_trace(trace_a, trace_b)
    if workers is not None and dask_address is not None:
        raise click.UsageError("give --workers N (a local cluster) or --dask ADDRESS (a running one), not both")
    on_dask = workers is not None or dask_address is not None
    if output is not None:
        from specdiff.tui.atomic import check_writable

        check_writable(output, option="-o")
    # A bar on a terminal's stderr only: stdout is the report, and a log or pipe gets no bar lines.
    show_progress = fmt != "json" and sys.stderr.isatty()
    bar = None
    tensor = ""  # the tensor being compared, named beside the bar

    def on_tensor(name, i, total):
        nonlocal tensor
        tensor = name

    def on_rows(done, total):
        nonlocal bar
        if bar is None:
            bar = click.progressbar(length=total, label="  comparing rows", file=sys.stderr,
                                    item_show_func=lambda item: item)
        bar.update(done - bar.pos, current_item=tensor)

    def on_first(early):
        # Said at once (proven by the rows read so far, replay/diff/compare/early.py); totals follow.
        click.echo(("\n" if bar is not None else "") + f"{early.verdict()} (computing the totals...)", err=True)

    from specdiff.replay.diff.pipeline import diff_traces  # torch-free CLI start
    from specdiff.replay.diff.report import render_json, render_text

    if on_dask:
        from specdiff.replay.diff.compare.blocks import worker_path
        from specdiff.tui.dask_blocks import dask_blocks  # dask is imported only when asked for

        for path in (trace_a, trace_b):
            worker_path(path)  # refuse a pair the workers cannot read before starting any
        where = dask_blocks(workers=workers, address=dask_address)
    else:
        where = nullcontext(None)
    with where as runner:
        report = diff_traces(trace_a, trace_b, preset=preset, overrides=overrides, narrow=not no_narrow,
                             on_rows=on_rows if show_progress else None,
                             on_first=on_first if show_progress else None,
                             progress=on_tensor if show_progress else None, runner=runner,
                             draft_path=draft_dir, target_path=target_dir)
    if bar is not None:
        bar.render_finish()
    if graft:
        from specdiff.replay.diff.rerun.graft import graft as run_graft

        if fmt != "json":
            click.echo("  grafting (re-running the training draft on serving's inputs)...", err=True)
        report.grafts = run_graft(report.inputs, draft_path=draft_dir, target_path=target_dir)
    text = render_json(report) if fmt == "json" else render_text(report)
    if output is None:
        click.echo(text)
    else:
        from specdiff.tui.atomic import write_text_atomic

        try:
            write_text_atomic(output, text + "\n")
        except OSError as e:
            raise SpecdiffError(f"-o {output}: cannot write the report ({e.strerror or e})") from None
    # A damaged trace that lost compared rows, or a cut-off one, is never "equivalent" (the verdict says why).
    sys.exit(EXIT_DIVERGED if report.diverged or not report.conclusive else EXIT_OK)
