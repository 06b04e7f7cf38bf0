"""``specdiff fix --verify``: serve the fixed draft with the recorded target, speculative settings and
prompts, record both sides again and diff them, with the demo's own phases (run.py
``serve_and_trace`` and ``record_train``): one verdict line, "fix verified: no divergence; accept length
2.24 -> 3.61 (training side 3.65)", or the new first divergence when the fix was not enough.

On the CPU, with the engine the serving trace was recorded on: SGLang (the CPU launcher of
tracer/engines), or vLLM from its venv (``make vllm-venv``; served with the launcher's flags and the
recorded number of drafts per step: vLLM's other given options are not replayed, and a fix that is a
server option is SGLang's only, replay/fix/plan.py).
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

from specdiff.demo.run import (
    VLLM_CACHE,
    DemoError,
    record_train,
    serve_and_trace,
    serve_and_trace_vllm,
    vllm_python,
)
from specdiff.eagle3.engines import REGISTRY

__all__ = ["Verdict", "demo_fix", "served_options", "training_options", "verify_fix"]


@dataclass(frozen=True)
class Verdict:
    """What re-serving the fix showed.

    Attributes:
        verified: no divergence between the new training and serving traces.
        line: the one verdict line.
        before / after: serving's mean accept length over the aligned positions, in the report the
            fix came from and in the new one (None: not measured).
        training: the new training side's mean accept length (None: not measured).
        estimate: the accept length ``diff --graft`` predicted for the fix before the run (the
            training draft re-run on serving's inputs with the fixed input substituted), None when
            the graft could not run or has no input for the cause.
        first / cause: the new first divergence and its first cause when not verified, else None.
        traces: the new (training, serving) trace paths.
    """

    verified: bool
    line: str
    before: float | None
    after: float | None
    training: float | None
    estimate: float | None
    first: str | None
    cause: str | None
    traces: tuple[str, str]

    def to_json(self) -> dict:
        return {"verified": self.verified, "line": self.line, "accept_length_before": self.before,
                "accept_length_after": self.after, "accept_length_training": self.training,
                "accept_length_estimate": self.estimate,
                "first_divergence": self.first, "cause": self.cause, "traces": list(self.traces)}


#: causes whose fix re-expresses the trained weights in serving's layout (replay/fix/plan.py
#: ``_aux_permutation``: fc's column blocks reordered to the serving concat order): the training side
#: of the verification is the fixed draft in serving's order, which computes what training computed;
#: the trained draft in its own order would differ slot by slot at target.aux.* by construction
REEXPRESSED = {"aux_slot_permutation"}


def served_options(contract: dict) -> list[str]:
    """The SGLang flags the operator gave the recorded server that change what it computes (the options
    replay/diff/contract/facts.py has a row for, read from the contract's ``engine_options_given``), so the fixed
    draft is served as the broken one was: ``["--speculative-draft-window-size", "8"]``. A true flag is
    given bare, a false one left out (SGLang's store_true flags), a dict or list as JSON."""
    import json

    from specdiff.replay.diff.contract.facts import fact_row
    from specdiff.tracer.contract import known

    out: list[str] = []
    for name, entry in sorted((known(contract, "engine_options_given") or {}).items()):
        if not isinstance(entry, dict) or fact_row(f"engine_options.{name}") is None:
            continue
        value, flag = entry.get("value"), "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        out += [flag] if value is True else [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return out


def training_options(contract: dict) -> list[str]:
    """The ``record train`` flags that reproduce how the training trace computed beyond its aux layers:
    ``--draft-window W`` when its draft attended by SGLang's window rule (contract ``draft_attention_window``)."""
    from specdiff.eagle3.attention_window import KV
    from specdiff.tracer.contract import known

    kv = {w["window"] for w in known(contract, "draft_attention_window") or []
          if isinstance(w, dict) and w.get("distance") == KV}
    return ["--draft-window", str(kv.pop())] if len(kv) == 1 else []


def _path(trace, fact: str) -> Path:
    from specdiff.tracer.paths import contract_path, is_model_dir

    found = contract_path(trace, fact, want=is_model_dir)
    if found.path is None:
        raise DemoError("--verify: " + (found.message() if found.recorded else f"{trace.path} records no {fact}"))
    return found.path


def _fmt(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def estimate(report, cause: str) -> tuple[float | None, str]:
    """(accept length, words): what ``diff --graft`` predicts serving accepts with ``cause`` fixed, the
    substitution of the input the fix changes (its replay/diff/causes.py row's ``graft_input``); (None, why) when
    the graft cannot run (no draft checkpoint here, nothing to replay) or no input stands for the cause."""
    from specdiff.replay.diff.causes import cause_row
    from specdiff.replay.diff.rerun.graft import graft
    from specdiff.tracer.errors import SpecdiffError

    name = cause_row(cause).graft_input
    if not name:
        return None, f"no graft input stands for {cause}"
    try:
        found = next((g for g in graft(report.inputs) if g.name == name), None)
    except SpecdiffError as e:  # GraftError, a checkpoint not found here
        return None, f"the graft could not run: {e}"
    if found is None:
        return None, f"the graft did not substitute {name}"
    return found.mean_accept_length, (f"graft estimate: accept length {found.baseline_accept_length:.2f} -> "
                                      f"{found.mean_accept_length:.2f} with training's {name}")


def verify_fix(report, fixed: Path, workdir: Path, cause: str | None = None, options=()) -> Verdict:
    """Serve ``fixed`` (the draft ``specdiff fix`` wrote) as the serving trace of ``report`` (a
    ``DiffReport``, training vs serving) was served, replay it with the training draft and options,
    diff, and judge. ``workdir``: where the new traces and the server log go (made if absent).
    ``cause``: the cause fixed, for the estimate before the run (:func:`estimate`; None: none).
    ``options``: the fix's server option edits (replay/fix/plan.py ``OptionEdit``), applied to the options
    the recorded server was given (:func:`served_options`).

    Raises:
        DemoError: a serving trace of an engine other than SGLang or vLLM, no vLLM venv for a vLLM
            trace, a model path not found here, the server or ``record train`` failed (one line each).
    """
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.fix.plan import apply_options
    from specdiff.tracer.contract import known

    traces = report.traces
    train, serve = (traces.x, traces.y) if traces.x.side == "train" else (traces.y, traces.x)
    engine = known(serve.contract, "engine") or "sglang"
    if engine not in REGISTRY:
        raise DemoError(f"--verify serves {' or '.join(s.title for s in REGISTRY.values())} on the CPU; the serving "
                        f"trace was recorded on {engine}")
    target = _path(serve, "model_name")
    prompts = [[int(t) for t in s.tokens[:s.prompt_len]] for s in serve.sequences]
    new_tokens = min((len(s.tokens) - s.prompt_len for s in serve.sequences), default=0)
    if not prompts or new_tokens < 1:
        raise DemoError("--verify: the serving trace holds no generated sequence to serve again")
    spec = {k: int(v) for k, v in (("num_steps", known(serve.contract, "spec_steps")),
                                   ("topk", known(serve.contract, "spec_topk")),
                                   ("num_draft_tokens", known(serve.contract, "spec_draft_tokens"))) if v}
    est, words = estimate(report, cause) if cause else (None, "")
    if words:
        print(f"    {words}", file=sys.stderr)
    workdir.mkdir(parents=True, exist_ok=True)
    new_serve, new_train = workdir / "serve.trace", workdir / "train.trace"
    if new_serve.exists():
        import shutil

        shutil.rmtree(new_serve)
    trained = _path(train, "draft_name")
    order = known(train.contract, "aux_concat_order") or known(train.contract, "aux_hf_indices")
    if cause in REEXPRESSED:  # the fixed draft computes what training did, in serving's concat order
        trained = fixed
        order = known(serve.contract, "aux_concat_order") or known(serve.contract, "aux_hf_indices")
    extra = ["--aux-layers", ",".join(str(int(i)) for i in order), "--aux-convention", "hf"] if order else []
    extra += training_options(train.contract)
    with contextlib.redirect_stdout(sys.stderr):  # the demo phases' progress lines: stdout is the verdict (JSON)
        if REGISTRY[engine].own_venv:  # vLLM, from its venv (run.py check_engine)
            serve_and_trace_vllm(models=target.parent, target=target, served_draft=fixed, trace=new_serve,
                                 prompts=prompts, max_new_tokens=new_tokens, log_path=workdir / "server.log",
                                 python=vllm_python(), cache_root=VLLM_CACHE,
                                 num_speculative_tokens=spec.get("num_steps", 3))
        else:
            serve_and_trace(models=target.parent, target=target, served_draft=fixed, trace=new_serve,
                            prompts=prompts, max_new_tokens=new_tokens, log_path=workdir / "server.log", spec=spec,
                            extra_args=tuple(apply_options(served_options(serve.contract), options)))
        record_train(models=target.parent, target=target, serve_trace=new_serve, out=new_train,
                     draft=trained, extra=extra)
    after = diff_traces(str(new_train), str(new_serve))
    before_acc = report.acceptance.y if traces.y is serve else report.acceptance.x
    acc = after.acceptance
    after_serve, after_train = (acc.y, acc.x) if after.traces.y.side == "serve" else (acc.x, acc.y)
    b, a, t = before_acc.mean_accept_length, after_serve.mean_accept_length, after_train.mean_accept_length
    paths = (str(new_train), str(new_serve))
    accept = f"accept length {_fmt(b)} -> {_fmt(a)} (training side {_fmt(t)}" + (
        f"; estimated {_fmt(est)} before the run)" if est is not None else ")")
    compared = len(after.alignment.seq_pairs)
    if compared < len(prompts):  # a pair that lost requests proves nothing about them
        return Verdict(False, f"fix not verified: only {compared} of the {len(prompts)} served sequences were "
                              f"recorded on both sides (see {workdir / 'server.log'})", b, a, t, est, None, None, paths)
    if not after.diverged and not after.conclusive:  # cut off, damaged or nothing compared: no proof either way
        return Verdict(False, f"fix not verified: {after.verdict()}", b, a, t, est, None, None, paths)
    if not after.diverged:
        return Verdict(True, f"fix verified: no divergence; {accept}", b, a, t, est, None, None, paths)
    first = after.first.name if after.first is not None else "the crash"
    now = next((e.cause for e in after.explanations), None)
    return Verdict(False, f"fix not enough: first divergence now at {first}" + (f" ({now})" if now else "")
                   + f"; {accept}", b, a, t, est, first, now, paths)


def demo_fix(report, workdir: Path) -> tuple[bool, dict]:
    """``specdiff demo --verify-fix``: ``specdiff fix`` on the demo's ``report`` into
    ``workdir / "fixed-draft"`` (replaced if there), then :func:`verify_fix` into
    ``workdir / "fix-verify"``; prints the change and the verdict line. Returns (verified, what
    happened as JSON). A cause with no mechanical fix is said in one line (verified False).

    Raises:
        DemoError: as :func:`verify_fix`.
    """
    from specdiff.replay.fix.plan import NoMechanicalFix, plan_fix
    from specdiff.replay.fix.write import change_json, change_text, write_fix

    try:
        plan = plan_fix(report)
    except NoMechanicalFix as e:
        print(f"    {e}")
        return False, {"refused": str(e)}
    if plan is None:
        print("    nothing to fix: the traces agree within tolerance")
        return True, {"cause": None}
    out = workdir / "fixed-draft"
    write_fix(plan, out, overwrite=True)
    print("\n".join(f"    {line}" for line in change_text(plan, out).splitlines()))
    verdict = verify_fix(report, out, workdir / "fix-verify", cause=plan.cause, options=plan.options)
    print(f"    {verdict.line}")
    return verdict.verified, {**change_json(plan, out), "verify": verdict.to_json()}
