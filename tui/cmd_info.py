"""``specdiff info TRACE``: contract facts, sequences, tensors and the trace's completeness.

Without ``--verify`` damage visible without reading a value is listed (journal, metadata, chunk
files missing or cut short: ``Trace.check_sizes``); ``--verify`` reads every chunk and lists each
damaged one (tracer.store.damage). Exit 1 if any.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Mapping

import click

from specdiff.replay.diff.textwidth import output_width
from specdiff.tracer.contract import unknown_facts
from specdiff.tracer.crash import describe_crash
from specdiff.tui.cli import EXIT_DIVERGED, EXIT_OK, cli, on_interrupt

KEY_W = 24  # contract fact names are at most this wide (the value column starts after it)
#: facts read whole from the live objects (tracer/config_facts.py, tracer/weight_facts.py): every key of a
#: config, every engine option, every tensor; ``info`` says how many, ``diff`` compares them
WHOLE_FACTS = ("draft_config", "target_config", "engine_options", "draft_structure", "target_structure",
               "draft_weights", "target_weights")


def scalar(v) -> str:
    """A contract value for people: floats to 4 significant digits, lists without quotes, None as none
    (the exact values are in the trace's journal and ``open_trace(...).contract``)."""
    if isinstance(v, bool) or v is None:
        return "none" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(scalar(x) for x in v) + "]"
    return str(v)


def _item(v: Mapping) -> str:
    """One dict in a list (a stored pre-flight finding: severity, kind, engine, message, fix), or a
    default record train filled in (value, source), as one sentence."""
    if "message" in v:
        engine = f" ({v['engine']})" if v.get("engine") else ""
        fix = f"; fix: {v['fix']}" if v.get("fix") else ""
        return f"[{v.get('severity', 'info')}] {v.get('kind', '')}{engine}: {v['message']}{fix}"
    if set(v) == {"value", "source"}:
        return f"{scalar(v['value'])} ({v['source']})"
    return "; ".join(f"{k} {scalar(x)}" for k, x in v.items())


def fact_lines(key: str, value, *, indent: int = 2) -> list[tuple[str, str, int]]:
    """(key, value text, indent) rows for one contract fact: a mapping becomes one row per entry
    (entries with the same text grouped under their joined keys), a list of mappings one row per
    item; everything else one row (``scalar``)."""
    if isinstance(value, Mapping) and value:
        rows = [(key, "", indent)]
        groups: dict[str, list[str]] = {}
        for k, v in value.items():
            groups.setdefault(_item(v) if isinstance(v, Mapping) else scalar(v), []).append(str(k))
        rows += [(", ".join(keys), text, indent + 2) for text, keys in groups.items()]
        return rows
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
        return [(key, "", indent)] + [("", _item(v), indent + 2) for v in value]
    return [(key, scalar(value), indent)]


def render_rows(rows: list[tuple[str, str, int]], width: int) -> list[str]:
    """``key  value`` lines at ``width``, values in one column (``2 + KEY_W + 1``) wrapped under it;
    a key too long for the column puts its value on the next line, indented; a row without key
    is a list item (wrapped under itself)."""
    col = 2 + KEY_W + 1
    out = []
    for key, text, indent in rows:
        head = " " * indent + key
        if not text:
            out.append(head)
            continue
        at = col
        if not key:
            head, at = " " * indent, indent
        elif len(head) >= col:
            out.append(head)
            head, at = "", indent + 4
        body = textwrap.wrap(text, width=max(width - at, 20), break_long_words=False, break_on_hyphens=False,
                             subsequent_indent="  " if not key else "")
        out.append(head.ljust(at) + body[0])
        out += [" " * at + line for line in body[1:]]
    return out


def describe(trace, *, verified: bool = False, width: int | None = None) -> str:
    """Plain-text summary of an opened trace (what ``specdiff info`` prints); ``verified``: every
    chunk was read (``Trace.verify``) before, so no damage line means none exists. ``width``: lines
    wrap at it (default: the terminal's, or ``textwidth.DEFAULT_WIDTH`` when not a terminal)."""
    width = output_width(width)
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
    rows = []
    for key in sorted(trace.contract):
        if key in ("unobservable", "crash", "side"):  # side: said on the second line
            continue
        value = trace.contract[key]
        if key in WHOLE_FACTS and isinstance(value, Mapping):  # hundreds of keys: counted, not listed
            rows.append((key, f"{len(value)} entries (each one: open_trace(path).contract[{key!r}])", 2))
            continue
        rows += fact_lines(key, value)
    lines += render_rows(rows, width)
    unknown = unknown_facts(trace.contract)
    if unknown:
        lines.append(f"unknown    {len(unknown)} contract fact(s) recorded as unknown")
        lines += render_rows([(field, why, 2) for field, why in unknown.items()], width)
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
    return ["damage     none seen without reading the values (`specdiff info --verify` reads every chunk)"]


@cli.command()
@click.argument("trace")
@click.option("--verify", is_flag=True,
              help="Read every chunk (checksums, decoding) and list each damaged one; exit 1 if any.")
def info(trace, verify):
    """Print a trace's contract facts, sequences, tensors and whether it was closed cleanly.

    TRACE is a trace directory or an fsspec URL (s3://..., memory://...). Damage seen without
    reading a value (journal, metadata, chunk files missing or cut short) is listed; --verify also
    reads every chunk (checksums, decoding).
    Exit code: 0, 1 when damage was found, 2 bad input (not a trace), 130 interrupted.
    """
    on_interrupt("no summary was printed (info writes nothing)")
    from specdiff.tracer.store import open_trace  # zarr: when a trace is read, not for --help

    opened = open_trace(trace)
    if verify:
        opened.verify()
    else:
        opened.check_sizes()
    click.echo(describe(opened, verified=verify))
    sys.exit(EXIT_DIVERGED if opened.damage else EXIT_OK)
