"""The ``specdiff`` command line. Subcommands live in small modules and register here.

Exit codes scripts can rely on: 0 ok / equivalent, 1 divergence or findings with errors,
2 bad input (one line on stderr: ``specdiff: error: <what is wrong and what to do>``).
"""

from __future__ import annotations

import sys

import click

from specdiff.tracer.errors import SpecdiffError

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecdiffError as exc:
            click.echo(f"specdiff: error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specdiff")
def cli():
    """specdiff: find where EAGLE-3 training and SGLang serving first disagree, and why.

    \b
    Typical flow:
      specdiff record serve --cpu -- --model-path T --speculative-draft-model-path D ...
      specdiff record train --target T --draft D --replay serve.trace -o train.trace
      specdiff diff train.trace serve.trace      (or: specdiff view ...)
    """


def _register():
    from specdiff.tui import (  # noqa: F401  (register on import)
        cmd_check,
        cmd_demo,
        cmd_diff,
        cmd_info,
        cmd_record,  # record serve / record client
        cmd_record_train,  # noqa: F401  (record train; imports the record group)
        cmd_view,
    )


def main(argv=None):
    """Console-script entry point."""
    _register()
    cli.main(args=argv, prog_name="specdiff")
