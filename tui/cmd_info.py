"""``specdiff info TRACE``: contract facts, sequences, tensors and the trace's completeness.

``--verify`` reads every chunk and lists each damaged one (tracer.store.damage), exit 1 if any.
"""

from __future__ import annotations

import sys

import click

from specdiff.replay.diff.contract_check import unknown_facts
from specdiff.tracer.crash import describe_crash
from specdiff.tracer.store import open_trace
from specdiff.tui.cli import EXIT_DIVERGED, EXIT_OK, cli


def describe(trace, *, verified: bool = False) -> str:
    """Plain-text summary of an opened trace (what ``specdiff info`` prints); ``verified``: every
    chunk was read (``Trace.verify``) before, so no damage line means none exists."""
    lines = [f"trace      {trace.path}",
             f"side       {trace.side}   format {trace.format}   records {trace.records}"]
    if trace.closed:
        lines.append("state      closed cleanly")
    else:
        cut = f", last {trace.cut_tail_bytes} bytes of a record cut" if trace.cut_tail_bytes else ""
        lines.append(f"state      CUT OFF: the writer did not close it: still writing, or stopped "
                     f"(all complete records kept{cut})")
    ranks = getattr(trace, "ranks", None)  # tracer.store.ranks.RankedTrace: one store per DP replica
    if ranks:
        lines.append(f"ranks      {len(ranks)} (one store per data-parallel replica)")
        for label, t in ranks:
            state = "closed cleanly" if t.closed else "CUT OFF"
            lines.append(f"  {label:8s} {t.path}   {len(t.sequences)} sequences, {t.records} records, {state}")
    crash = trace.contract.get("crash")
    if isinstance(crash, dict):
        lines.append(f"crash      the server raised {describe_crash(crash)}")
        if crash.get("rids"):
            lines.append(f"  requests   {', '.join(crash['rids'])}")
        for key, shape in (crash.get("forward_shapes") or {}).items():
            lines.append(f"  {crash.get('forward')} {key}: {shape}")
        for key, shape in (crash.get("shapes") or {}).items():
            lines.append(f"  {key}: {shape}")
        if crash.get("where"):
            lines.append(f"  raised at  {crash['where'][-1]}")
    lines.append("contract")
    for key in sorted(trace.contract):
        if key in ("unobservable", "crash"):
            continue
        lines.append(f"  {key:24s} {trace.contract[key]}")
    unknown = unknown_facts(trace.contract)
    if unknown:
        lines.append(f"unknown    {len(unknown)} contract fact(s) could not be read from the engine")
        lines += [f"  {field:24s} {why}" for field, why in unknown.items()]
    for u in trace.contract.get("unobservable") or []:
        if isinstance(u, dict) and u.get("tensors"):
            lines.append(f"  unobservable tensors     {', '.join(u['tensors'])} (no {u.get('name')})")
    lines.append(f"sequences  {len(trace.sequences)}")
    for s in trace.sequences[:20]:
        lines.append(f"  seq {s.id:<4d} len {len(s.tokens):<5d} prompt {s.prompt_len:<5d} rid {s.rid}")
    if len(trace.sequences) > 20:
        lines.append(f"  ... {len(trace.sequences) - 20} more")
    lines.append("tensors")
    for name in trace.names:
        info = trace.info(name)
        dims = ", ".join(f"{d}={n}" for d, n in zip(info.dims, info.shape, strict=False))
        lines.append(f"  {name:26s} {info.dtype:9s} rows {info.rows:<8d} [{dims}]")
    lines += damage_lines(trace.damage, verified=verified)
    return "\n".join(lines)


def damage_lines(damage: list, *, verified: bool) -> list[str]:
    """The ``damage`` section: one line per damaged part (``Damage.message``)."""
    if damage:
        return [f"damage     {len(damage)} damaged part{'s' if len(damage) > 1 else ''}"] + \
            [f"  {d.message()}" for d in damage]
    if verified:
        return ["damage     none: every chunk was read and checked"]
    return ["damage     none found at open (`specdiff info --verify` reads every chunk)"]


@cli.command()
@click.argument("trace")
@click.option("--verify", is_flag=True,
              help="Read every chunk (checksums, decoding) and list each damaged one; exit 1 if any.")
def info(trace, verify):
    """Print a trace's contract facts, sequences, tensors and whether it was closed cleanly.

    TRACE is a trace directory or an fsspec URL (s3://..., memory://...). Damage found at open
    (journal, metadata, missing chunk files) is listed; --verify also reads every chunk.
    Exit code: 0, or 1 when damage was found.
    """
    opened = open_trace(trace)
    if verify:
        opened.verify()
    click.echo(describe(opened, verified=verify))
    sys.exit(EXIT_DIVERGED if opened.damage else EXIT_OK)
