"""The ``specdiff`` command line. Subcommands live in small modules and register here.

Exit codes scripts can rely on: 0 ok / equivalent, 1 divergence or findings with errors,
2 bad input (one line on stderr: ``specdiff: error: <what is wrong and what to do>``).
"""

from __future__ import annotations

import importlib
import sys

import click

from specdiff.tracer.errors import SpecdiffError

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


#: subcommand -> the modules that register it (``record`` is a group: serve/client, then train).
#: Only the command asked for is imported: ``check`` loads torch (checkpoint reading), which would
#: add seconds to every ``specdiff diff`` / ``view`` start (click docs, "Lazily Loading Subcommands").
#: ``--capture`` of ``record serve`` and ``record train``, one wording (k: the command's top-k width)
CAPTURE_HELP = ("default: the draft logits kept as their top-k ids and values plus the logsumexp (k = {k}); "
                "full: every draft logit.")

SUBCOMMANDS = {
    "check": ("cmd_check",),
    "demo": ("cmd_demo",),
    "diff": ("cmd_diff",),
    "info": ("cmd_info",),
    "record": ("cmd_record", "cmd_record_train"),
    "upgrade": ("cmd_upgrade",),
    "view": ("cmd_view",),
    "watch": ("cmd_watch",),
}


class _Group(click.Group):
    """The top-level group: turns a :class:`SpecdiffError` into one ``specdiff: error:`` line
    (exit 2), and imports a subcommand's module on its first lookup. The modules register their
    commands on :data:`cli` when imported, and import this module to reach it, so they are
    imported lazily rather than at the top of this file."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecdiffError as exc:
            click.echo(f"specdiff: error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    def get_command(self, ctx, cmd_name):
        _register(SUBCOMMANDS.get(cmd_name, ()))
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def main(self, args=None, prog_name=None, **kwargs):
        # "specdiff" also under `python -m specdiff.tui` and click.testing.CliRunner
        return super().main(args, prog_name or "specdiff", **kwargs)


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


def _register(modules) -> None:
    for module in modules:
        importlib.import_module(f"specdiff.tui.{module}")


#: The public entry point: the ``specdiff`` console script, ``python -m specdiff.tui``, and the
#: command tests invoke (``click.testing.CliRunner().invoke(main, ["diff", ...])``). A click group,
#: so ``main(["diff", a, b])`` runs like the shell command (and exits with its code).
main = cli
