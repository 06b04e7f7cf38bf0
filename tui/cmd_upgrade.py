"""``specdiff upgrade OLD NEW``: copy a trace written by an older specdiff into today's layout
(tracer/store/upgrade.py)."""

from __future__ import annotations

import click

from specdiff.tui.cli import cli, on_interrupt


@cli.command()
@click.argument("old")
@click.argument("new")
@click.option("--compact", is_flag=True,
              help="Also shrink each array's chunks to the rows it holds (for small traces kept in a repo).")
def upgrade(old, new, compact):
    """Copy trace OLD to NEW in today's layout; OLD is verified first and never changed.

    \b
    Adds what older traces lack: a crc32c checksum on every chunk, the sequences/id array, bf16
    tensors declared as zarr's bfloat16 data type (xarray and zarr read real bfloat16 values),
    and consolidated metadata. Values are copied bit for bit.
    NEW appears whole or not at all (built beside it, then renamed).
    Exit code: 0 upgraded, 2 bad input (OLD damaged, unclosed or per-rank; NEW exists or its folder
    does not), 130 interrupted (NEW not written).
    """
    on_interrupt(f"{new} was not written (its partial copy was removed); {old} is unchanged")
    from specdiff.tracer.store.upgrade import upgrade as run

    n = run(old, new, compact=compact)
    click.echo(f"{new}: {n} arrays rewritten (crc32c checksums, bfloat16 data type), metadata consolidated")
