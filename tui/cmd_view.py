"""``specdiff view A B``: the interactive terminal diff (a Textual app; tui/app.py)."""

from __future__ import annotations

import sys

import click

from specdiff.replay.diff.measure.tolerance import PRESETS, parse_overrides
from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.cli import cli, on_interrupt, refuse_the_same_trace


@cli.command()
@click.argument("trace_a")
@click.argument("trace_b")
@click.option("--preset", type=click.Choice(list(PRESETS)), default="default", show_default=True,
              help="Tolerance preset to start with (t cycles them in the app).")
@click.option("--tol", "tol", multiple=True, metavar="STAGE=rel:X,cos:Y",
              help="Override a stage's or tensor's tolerance, e.g. --tol draft.fc_out=rel:0.1 (repeatable).")
def view(trace_a, trace_b, preset, tol):
    """Open TRACE_A (usually training) and TRACE_B (usually serving) in the interactive diff.

    The app lands on the first divergence. Keys: f first, n/N next/previous divergence,
    arrows move, enter drill in, d depths, t tolerance preset, / filter, e export, x explanation,
    ? every key, q quit; ctrl+p finds each of these by name.
    Needs a terminal: stdin (keys) and stderr (the screen); without one it refuses (exit 2) and
    `specdiff diff A B` prints the report instead.
    Exit code, however the app is left (q, ctrl+q): 0 only once the report says the traces agree,
    1 a divergence or the diff still deciding, 2 bad input (an unreadable trace or no terminal: one
    line on stderr; traces with no common sequence: an error screen), 130 interrupted (Ctrl-C, in
    the app or while it starts: one line on stderr).
    """
    on_interrupt("the app was closed; nothing was written (view writes only the slices e exports)")
    overrides = parse_overrides(tol)
    refuse_the_same_trace(trace_a, trace_b)
    from specdiff.tracer.store import open_trace

    for path in (trace_a, trace_b):  # a bad path is one line on stderr, not a full-screen app
        open_trace(path)
    from specdiff.tui.terminal import has_terminal, run_app

    if not has_terminal():  # the app would wait for keys that never come, or draw into a file
        raise SpecdiffError("view needs a terminal (the app reads keys from stdin and draws on stderr); "
                            "for the report without one: specdiff diff TRACE_A TRACE_B --format text")
    from specdiff.tui.app import SpecdiffApp

    sys.exit(run_app(SpecdiffApp(trace_a, trace_b, preset=preset, overrides=overrides)))
