"""``specdiff info TRACE``: contract facts, sequences, tensors and the trace's completeness."""

from __future__ import annotations

import click

from specdiff.replay.contract_check import unknown_facts
from specdiff.tracer.crash import describe_crash
from specdiff.tracer.store import open_trace

from .cli import cli


def describe(trace) -> str:
    """Plain-text summary of an opened trace (what ``specdiff info`` prints)."""
    lines = [f"trace      {trace.path}",
             f"side       {trace.side}   format {trace.format}   records {trace.records}"]
    if trace.closed:
        lines.append("state      closed cleanly")
    else:
        cut = f", last {trace.cut_tail_bytes} bytes of a record cut" if trace.cut_tail_bytes else ""
        lines.append(f"state      CUT OFF: the writer did not close it (all complete records kept{cut})")
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
    return "\n".join(lines)


@cli.command()
@click.argument("trace")
def info(trace):
    """Print a trace's contract facts, sequences, tensors and whether it was closed cleanly.

    TRACE is a trace directory or an fsspec URL (s3://..., memory://...).
    """
    click.echo(describe(open_trace(trace)))
