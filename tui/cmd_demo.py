"""``specdiff demo``: the end-to-end demo on the built-in tiny models and a real CPU SGLang server
(the command; the demo itself is ``specdiff.demo``)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import click

from specdiff.demo.scenarios import DEMO_ENGINE, SCENARIOS, describe
from specdiff.eagle3.engines import ENGINES, VLLM
from specdiff.tracer.errors import SpecdiffError
from specdiff.tui.cli import cli, on_interrupt


def _scenarios_epilog(width: int = 78) -> str:
    """Every scenario of ``--scenario`` with what it seeds (scenarios.describe, the Llama demo's ids);
    click keeps a ``\\b`` paragraph as written, so it is wrapped here."""
    lines = ["\b", "Scenarios (ids of the Llama demo target):"]
    for name in SCENARIOS:
        lines += textwrap.wrap(describe(name), width=width, initial_indent=f"  {name:15s} ",
                               subsequent_indent=" " * 18, break_on_hyphens=False)
    return "\n".join(lines)


@cli.command(epilog=_scenarios_epilog())
@click.option("--scenario", type=click.Choice(list(SCENARIOS)), default="seed", show_default=True,
              help="The mistake the demo seeds (each one is explained under Scenarios below).")
@click.option("--no-tui", is_flag=True, help="Print the text report instead of opening the app.")
@click.option("--workdir", type=click.Path(path_type=Path), default=Path("specdiff-demo"), show_default=True,
              help="Where traces, the served draft copy, the server log and summary.json go "
                   "(a subfolder per scenario).")
@click.option("--family", default="llama", show_default=True, metavar="FAMILY",
              help="Target family: llama (the demo pair), qwen3, qwen3_moe, deepseek_v3 (the seed's Kimi-K2 "
                   "architecture) or gpt_oss. The scenario's ids follow that target's SGLang aux-id rule.")
@click.option("--models", type=click.Path(path_type=Path), default=None,
              help="The tiny target/draft pair (built there on first use if missing) [default: traces/models "
                   "for llama, traces/families/FAMILY otherwise].")
@click.option("--engine", type=click.Choice(list(ENGINES)), default=DEMO_ENGINE, show_default=True,
              help=f"The serving engine. vllm: {VLLM.label} on the CPU from the vLLM venv (make vllm-venv), the llama "
                   "pair only; each scenario in vLLM's key and numbering (top-level eagle_aux_hidden_state_layer_ids, "
                   "id k = HF k); off-by-one is an SGLang-format draft, which crashes vLLM at the first request.")
@click.option("--prompts", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(8, 512), default=96, show_default=True)
@click.option("--verify-fix", is_flag=True,
              help="Then close the loop: write what `specdiff fix` writes for the cause found into "
                   "WORKDIR/SCENARIO/fixed-draft, serve it again (SGLang) and print the verdict "
                   "(\"fix verified: no divergence; accept length ...\"). Exit 0 only when it verified.")
def demo(scenario, no_tui, workdir, family, models, engine, prompts, max_new_tokens, verify_fix):
    """Watch specdiff find a training-vs-serving mismatch in a real SGLang server (CPU; 4 min 20 s on 2 cores).

    "--family deepseek_v3 --scenario seed" replays the motivating bug on its own architecture
    (MLA + MoE, SGLang's deepseek aux-id rule): a draft trained on [embedding, L3, L6] served
    capturing [L3, L6, L7].

    Serves the tiny demo draft with the scenario's mistake on a real SGLang 0.5.23 server with
    tracing on, records the training side by replaying the served sequences, and shows the
    first divergence with its explanation. Exit code 0 when the demo found what the scenario
    seeded (its mistake, or no divergence for 'correct'), 1 when it did not, 130 interrupted.
    The app opens when stdin, stdout and stderr are terminals; otherwise the text report is printed.
    """
    from specdiff.demo.run import run_demo  # torch, the server launcher: only when the demo runs
    from specdiff.tui.terminal import has_terminal

    tui = not no_tui and sys.stdout.isatty() and has_terminal()
    sub = scenario if family == "llama" else f"{family}-{scenario}"
    sub = sub if engine == DEMO_ENGINE else f"{engine}-{sub}"
    on_interrupt(f"the demo did not finish; {workdir / sub} holds what it wrote so far, not a complete run")
    try:
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecdiffError(f"--workdir {workdir}: cannot create {workdir / sub} ({e.strerror})") from None
    sys.exit(run_demo(scenario=scenario, workdir=workdir / sub, models=models, prompts=prompts,
                      max_new_tokens=max_new_tokens, view=_open_app if tui else None, family=family,
                      engine=engine, fix_step=_fix_step() if verify_fix else None))


def _fix_step():
    """``--verify-fix``'s step (imported here: the CLI starts without the demo's server code)."""
    from specdiff.demo.verify_fix import demo_fix

    return demo_fix


def _open_app(trace_a: str, trace_b: str) -> None:
    """The app on the demo's pair (imported here: the CLI starts without Textual's app)."""
    from specdiff.tui.app import SpecdiffApp
    from specdiff.tui.terminal import run_app

    on_interrupt("the app was closed; the demo had finished (its traces and summary.json are complete)")
    run_app(SpecdiffApp(trace_a, trace_b))
