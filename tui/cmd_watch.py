"""``specdiff watch``: attached to a live traced server, replay and diff each finished request and
alert as soon as serving is proved to diverge from training (replay/watch/)."""

from __future__ import annotations

import json
import re
import signal
import sys
import threading
from pathlib import Path

import click

from specdiff.eagle3.aux_layers import CONVENTIONS
from specdiff.replay.diff.measure.tolerance import PRESETS
from specdiff.replay.record.train_options import DEFAULTS, DEVICE_DEFAULT, DTYPE_NAMES
from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.cli import EXIT_DIVERGED, EXIT_OK, cli, on_interrupt
from specdiff.tui.cmd_record_train import _parse_layers


def _rates(summary: dict) -> str:
    per = summary.get("per_depth")
    if per is None:
        return "-"
    mean = summary.get("mean_accept_length")
    return "[" + ", ".join(f"{v:.2f}" for v in per) + "]" + (f" len {mean:.2f}" if mean is not None else "")


def _text(event) -> tuple[str, bool] | None:
    """(line, to stdout) for one event in text mode; alerts go to stdout, the rest to stderr."""
    d = event.data
    if event.kind == "start":
        return (f"watching {d['serve']} -> {d['out']}"
                + (f" (resuming: {d['resumed']} requests already replayed)" if d["resumed"] else ""), False)
    if event.kind == "request":
        r = d["rolling"]
        status = f"DIVERGED at {d['first']}" if d["diverged"] else "ok"
        return (f"request {d['key']} ({d['tokens']} tokens): {status}; rolling acceptance over "
                f"{r['serve']['requests']} requests: serve {_rates(r['serve'])}, train {_rates(r['train'])}", False)
    if event.kind == "skipped":
        return f"request {d['key']}: not replayed: {d['why']}", False
    if event.kind == "alert":
        where = f" pos {d['pos']}" + (f" depth {d['depth']}" if d.get("depth") else "") if d.get("pos") is not None else ""
        why = f" — {d['message']}" if d.get("message") else ""
        return (f"ALERT request {d['key']}: serving diverges from training: first divergence {d['tensor']}"
                f"{where}{why}" + (f" [slice: {d['slice']}]" if d.get("slice") else ""), True)
    if event.kind == "end":
        return (f"watched {d['replayed']} requests ({d['already_done']} already done before), "
                f"{d['diverged']} diverged, {d['alerts']} alerts", False)
    return None


def _exporter(out: Path):
    """The app's minimal-repro export (tui/export.py) of an alert's first divergence, under
    ``<out>/alerts/<request>/``."""
    def export(report, request):
        from specdiff.tui.export import export_slice
        from specdiff.tui.view import ViewModel

        vm = ViewModel(report)
        if vm.first is None:
            return None
        return export_slice(vm, vm.first, root=out / "alerts" / re.sub(r"[^A-Za-z0-9_.-]", "_", request.key))

    return export


@cli.command()
@click.option("--serve", "serve", required=True, metavar="SERVE_TRACE",
              help="The serving trace a live traced server is writing (its SPECDIFF_TRACE / record serve --trace).")
@click.option("--draft", "draft", required=True, type=click.Path(file_okay=False),
              help="The draft checkpoint as trained (SpecForge/SGLang or speculators format).")
@click.option("--target", "target", required=True, type=click.Path(file_okay=False),
              help="Local Hugging Face target model directory.")
@click.option("--out", "out", default="specdiff-watch", show_default=True, metavar="DIR",
              help="Watch folder: state (which requests were replayed), training traces, alert slices.")
@click.option("--once", is_flag=True,
              help="Replay the requests finished now, then exit: 1 if any diverged, else 0.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line on stdout (start, request, alert, end).")
@click.option("--prometheus-port", type=click.IntRange(1, 65535), default=None, metavar="N",
              help="Serve Prometheus metrics on http://0.0.0.0:N/metrics (needs prometheus_client).")
@click.option("--settle", type=click.FloatRange(min=0), default=5.0, show_default=True, metavar="SECONDS",
              help="A request whose tokens stay unchanged this long counts as finished (the trace has no "
                   "end-of-request entry); must exceed the longest pause between two decode steps.")
@click.option("--poll", type=click.FloatRange(min=0.05), default=1.0, show_default=True, metavar="SECONDS",
              help="Seconds between polls of the serving trace.")
@click.option("--window", type=click.IntRange(min=1), default=32, show_default=True,
              help="Requests in the rolling acceptance.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default="default", show_default=True,
              help="The diff's tolerance preset.")
@click.option("--aux-layers", default=None, metavar="IDS",
              help="Training aux layers in training's concat order (as record train; default: the draft config's).")
@click.option("--aux-convention", type=click.Choice(list(CONVENTIONS)), default=None,
              help="Convention of --aux-layers (as record train).")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default=None,
              help=f"Draft compute dtype (default: {DEFAULTS['dtype']}).")
@click.option("--target-dtype", type=click.Choice(DTYPE_NAMES), default=None,
              help=f"Target dtype; keep the serving dtype (default: {DEFAULTS['target_dtype']}).")
@click.option("--device", default=None, help=f"torch device of the training replay (default: {DEVICE_DEFAULT}).")
def watch(serve, draft, target, out, once, as_json, prometheus_port, settle, poll, window, preset, aux_layers,
          aux_convention, dtype, target_dtype, device):
    """Watch a live traced server: replay each finished request on the training side, diff it, and
    alert as soon as serving diverges from training.

    \b
    For every request the serving trace shows finished (tokens unchanged for --settle seconds, or
    the trace closed), the training side is replayed as `record train --replay` does, into a
    training trace in --out, and the request is diffed as `specdiff diff` would. Reported: a
    rolling per-depth acceptance of both sides (stderr; --json: stdout), and an ALERT line on
    stdout with the first divergence and the slice of both traces that shows it (--out/alerts/).
    Restartable: --out keeps which requests were replayed; a new run resumes after them.
    Ends when the serving trace is closed and done (or on SIGTERM, or Ctrl-C). Exit code: 1 if a
    request of this run diverged, else 0; 2 bad input; 130 Ctrl-C (one line: how many requests
    were replayed and diverged; --out keeps them).

    \b
    Example:
      SPECDIFF_TRACE=serve.trace python -m sglang.launch_server ...   (or: specdiff record serve)
      specdiff watch --serve serve.trace --draft D --target T --out watch/
    """
    from specdiff.replay.record.record_train import check_train_options, load_train_side
    from specdiff.replay.watch.watcher import Watcher

    on_interrupt("the watch stopped before it replayed a request")

    layers = _parse_layers(aux_layers)
    check_train_options(aux_layers=layers, aux_convention=aux_convention, dtype=dtype, target_dtype=target_dtype,
                        device=device)
    metrics = None
    if prometheus_port is not None:
        from specdiff.replay.watch.metrics import PrometheusMetrics

        metrics = PrometheusMetrics(prometheus_port)

    def on_event(event):
        if metrics is not None:
            metrics(event)
        if as_json:
            click.echo(json.dumps(event.data, default=str))
            sys.stdout.flush()
            return
        said = _text(event)
        if said is not None:
            click.echo(said[0], err=not said[1])

    def load_side(served_contract):
        return load_train_side(target, draft, served=served_contract, aux_layers=layers,
                               aux_convention=aux_convention, dtype=dtype, target_dtype=target_dtype, device=device)

    watcher = Watcher(serve, out, load_side=load_side, on_event=on_event, settle_s=settle, window=window,
                      preset=preset, export=_exporter(Path(out)))
    for opt, folder in (("--draft", draft), ("--target", target)):  # loaded at the first request: refuse now
        if not (Path(folder) / "config.json").is_file():
            raise SpecdiffError(f"{opt} {folder}: no config.json (a local Hugging Face model directory is needed)")
    if once and "://" not in serve and not Path(serve).exists():  # without --once the watch waits for it
        raise SpecdiffError(f"--serve {serve}: no such trace (the path does not exist)")
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the loop closes the training trace
    try:
        diverged = watcher.run(once=once, poll_s=poll, stop=stop)
    except KeyboardInterrupt:
        watcher.close()  # the training trace closed with every request replayed, the state saved
        on_interrupt(f"the watch stopped: {watcher.replayed} requests replayed by this run, {watcher.diverged} "
                     f"diverged; {out} keeps them (a new watch resumes after them)")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if metrics is not None:
            metrics.close()
    sys.exit(EXIT_DIVERGED if diverged else EXIT_OK)
