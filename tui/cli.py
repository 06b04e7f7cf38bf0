"""The ``specdiff`` command line. Subcommands live in small modules and register here.

Exit codes scripts can rely on (``EXIT_CODES``): 0 ok / equivalent, 1 divergence or findings with
errors, 2 bad input (one line on stderr: ``specdiff: error: <what is wrong and what to do>``; click's
usage errors too), 130 interrupted (Ctrl-C: one line, ``specdiff: interrupted: <what was not
written>``; a command names it with :func:`on_interrupt`).
"""

from __future__ import annotations

import atexit
import importlib
import sys

import click

from specdiff.tracer.errors import SpecdiffError

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130  # 130: 128 + SIGINT, as shells say

#: what each exit code means, for every command (the help's epilog and README's table say the same)
EXIT_CODES = (
    (EXIT_OK, "ok: the traces agree within tolerance, no error finding, the command did its work"),
    (EXIT_DIVERGED, "a divergence (diff, view, watch), an error finding (check), damage (info)"),
    (EXIT_BAD_INPUT, "bad input, one line 'specdiff: error: ...': a usage error, a bad option value,"),
    (None, "an unreadable or foreign trace or checkpoint, no terminal for the app (view)"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C), one line 'specdiff: interrupted: ...' saying what was"),
    (None, "not written; no partial output is left looking complete"),
)
_INTERRUPT_KEY = "specdiff.interrupted"


#: ``--capture`` of ``record serve`` and ``record train``, one wording (k: the command's top-k width)
CAPTURE_HELP = ("default: the draft logits kept as their top-k ids and values plus the logsumexp (k = {k}); "
                "full: every draft logit.")

#: subcommand -> the modules that register it (``record`` is a group: serve/client, then train).
#: A command runs with only its own modules imported (click docs, "Lazily Loading Subcommands");
#: ``specdiff --help`` imports them all for their one-line help, so they import torch, transformers,
#: SGLang, zarr and Textual inside the command bodies that use them, never at the top
#: (tests/tui/test_cli_startup.py; benchmarks/cli_startup.py times it).
SUBCOMMANDS = {
    "check": ("cmd_check",),
    "demo": ("cmd_demo",),
    "diff": ("cmd_diff",),
    "fix": ("cmd_fix",),
    "info": ("cmd_info",),
    "record": ("cmd_record", "cmd_record_train"),
    "upgrade": ("cmd_upgrade",),
    "view": ("cmd_view",),
    "watch": ("cmd_watch",),
}


def on_interrupt(what: str) -> None:
    """Say ``what`` (what is not written, what is kept) if Ctrl-C stops the running command now:
    ``specdiff: interrupted: <what>``, exit 130. A command calls it as it starts, and again when
    that changes. Outside a command (no click context) it does nothing."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_INTERRUPT_KEY] = what


def refuse_the_same_trace(trace_a, trace_b) -> None:
    """``diff`` or ``view`` of a trace against itself agrees by construction (it was a silent exit 0).

    Raises:
        SpecdiffError: one line naming the trace and what to give instead.
    """
    from specdiff.tracer.paths import same_store

    if same_store(trace_a, trace_b):
        raise SpecdiffError(f"TRACE_A and TRACE_B are the same trace ({trace_b}): a trace always agrees with itself; "
                            "give the training trace and the serving trace")


def _bad_input(exc: click.ClickException, ctx: click.Context | None) -> None:
    """One ``specdiff: error:`` line for a click usage error (click prints four), exit 2."""
    msg = " ".join(exc.format_message().split()).rstrip(".")
    if msg[:1].isupper() and msg[1:2].islower():
        msg = msg[0].lower() + msg[1:]
    ctx = getattr(exc, "ctx", None) or ctx
    where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
    click.echo(f"specdiff: error: {msg}{where}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _interrupted(what: str) -> None:
    """``specdiff: interrupted: <what>`` on stderr, exit 130 (``EXIT_INTERRUPTED``)."""
    # on a terminal the shell left "^C" on the line: the line starts on the next one
    click.echo(("\n" if sys.stderr.isatty() else "") + f"specdiff: interrupted: {what}", err=True)
    atexit.register(_quiet_teardown)  # runs before zarr's own exit handler (atexit is LIFO)
    sys.exit(EXIT_INTERRUPTED)


def _quiet_teardown() -> None:
    """At exit after Ctrl-C, keep the one line the only one: zarr reads through an event loop on its own
    thread (zarr/core/sync.py), and a read cut off mid-flight leaves tasks that asyncio reports when
    zarr's exit handler stops that loop ("Task was destroyed but it is pending!", "Task exception was
    never retrieved": up to thousands of lines after an interrupted ``info`` or ``view``). The command
    has already said what was kept; what a background thread leaves as the interpreter stops is not
    news to the user. An exit handler, so a caller that goes on (click's test runner) is untouched."""
    import logging
    import threading

    logging.getLogger("asyncio").disabled = True
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda unraisable: None


class _Group(click.Group):
    """The top-level group: maps what a command raises to the documented exit codes (``EXIT_CODES``)
    with one line on stderr: a :class:`SpecdiffError` or click usage error is ``specdiff: error:``
    (exit 2), Ctrl-C is ``specdiff: interrupted:`` (exit 130, never click's "Aborted!", exit 1).
    It imports a subcommand's module on its first lookup: the modules register their commands on
    :data:`cli` when imported, and import this module to reach it, so they are imported lazily
    rather than at the top of this file."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # `specdiff` alone: the help
        except click.ClickException as exc:
            _bad_input(exc, None)
        except KeyboardInterrupt:  # while the arguments are read: click would say "Aborted!", exit 1
            _interrupted("the command stopped before it started; nothing was written")

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecdiffError as exc:
            click.echo(f"specdiff: error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except click.exceptions.NoArgsIsHelpError:
            raise  # `specdiff record` alone: the group's help
        except click.ClickException as exc:
            _bad_input(exc, ctx)
        except (KeyboardInterrupt, click.Abort):
            _interrupted(ctx.meta.get(_INTERRUPT_KEY, "the command stopped before it finished"))

    def get_command(self, ctx, cmd_name):
        _register(SUBCOMMANDS.get(cmd_name, ()))
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def main(self, args=None, prog_name=None, **kwargs):
        # "specdiff" also under `python -m specdiff.tui` and click.testing.CliRunner (which passes "cli")
        return super().main(args, "specdiff", **kwargs)


def _exit_codes_epilog() -> str:
    """The help's exit-code table (``EXIT_CODES``); ``\\b`` keeps click from rewrapping it."""
    return "\n".join(["\b", "Exit codes (every command):"] + [f"  {code if code is not None else '':<4} {what}" for code, what in EXIT_CODES])


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_exit_codes_epilog())
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
