"""The package layout holds: imports go one way, and the redesign did not change what diff says.

Layers, bottom to top: eagle3 (the EAGLE-3 rules) <- tracer (recorders, trace store) <- replay
(reference model, training recorder, pre-flight check, diff engine) <- demo (the end-to-end demo,
its scenarios and data) <- tui (CLI and app). demo_models builds the demo's tiny models and is not
product code: no product module imports it, and it imports no tui.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("eagle3", "tracer", "replay", "demo", "tui", "demo_models")
# package -> the specdiff packages it must never import (lazily inside a function included)
FORBIDDEN = {
    "eagle3": {"tracer", "replay", "demo", "tui", "demo_models"},
    "tracer": {"replay", "demo", "tui", "demo_models"},
    "replay": {"demo", "tui", "demo_models"},
    "demo": {"tui", "demo_models"},
    "tui": {"demo_models"},
    "demo_models": {"tui"},
}
EXAMPLE = ROOT / "traces" / "examples" / "seed"


def _specdiff_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level specdiff package) of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside its own package by construction
                names = [path.relative_to(ROOT).parts[0]] if node.level == 1 else []
                if node.level > 1:
                    names = ["specdiff.<relative beyond package>"]
                names = [f"specdiff.{n}" if not n.startswith("specdiff.") else n for n in names]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "specdiff" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def _violations() -> list[str]:
    out = []
    for pkg, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for line, target in _specdiff_imports(path):
                if target in forbidden or target == "<relative beyond package>":
                    out.append(f"{path.relative_to(ROOT)}:{line} imports specdiff.{target}")
    return out


def test_imports_go_one_way_and_product_code_never_imports_demo_model_building():
    assert _violations() == []


def test_the_import_check_catches_a_recorder_that_imports_the_diff_engine(tmp_path, monkeypatch):
    # The check itself must be able to fail: a tracer module importing replay is reported.
    bad = ROOT / "tracer" / "_zz_import_direction_probe.py"
    bad.write_text("def f():\n    from specdiff.replay.diff import report  # noqa: F401\n")
    try:
        assert _violations() == ["tracer/_zz_import_direction_probe.py:2 imports specdiff.replay"]
    finally:
        bad.unlink()


#: layers inside tracer/, bottom to top: the format modules (tracer/*.py: schema, rows, contract, ...)
#: <- the store (tracer/store/) <- the recorders and their writers (tracer/engines/)
TRACER_LAYERS = (("tracer", ("tracer.store", "tracer.engines")), ("tracer/store", ("tracer.engines",)))


def _module_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path`` (lazy ones included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append((node.lineno, node.module or ""))
    return out


def _tracer_layer_violations() -> list[str]:
    out = []
    for folder, above in TRACER_LAYERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            for line, mod in _module_imports(path):
                if any(mod == f"specdiff.{a}" or mod.startswith(f"specdiff.{a}.") for a in above):
                    out.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    return out


def test_tracer_layers_go_one_way_format_then_store_then_engines():
    assert _tracer_layer_violations() == []
    probe = ROOT / "tracer" / "store" / "_zz_layer_probe.py"  # the check itself must be able to fail
    probe.write_text("def f():\n    from specdiff.tracer.engines.writer import open_writer  # noqa: F401\n")
    try:
        assert _tracer_layer_violations() == [
            "tracer/store/_zz_layer_probe.py:2 imports specdiff.tracer.engines.writer"]
    finally:
        probe.unlink()


DIFF = ROOT / "replay" / "diff"


def _imported_from_specdiff(path: Path) -> set[tuple[str, str]]:
    """(module, name) of every ``from specdiff.... import name`` in ``path`` (lazy ones included)."""
    return {(node.module, a.name) for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdiff.")
            for a in node.names}


def _pipeline_stages() -> set[tuple[str, str]]:
    """(module, function) of every stage the diff pipeline calls: the functions it imports (its
    classes are the values stages pass on, which a renderer may name)."""
    import importlib
    import inspect

    return {(mod, name) for mod, name in _imported_from_specdiff(DIFF / "pipeline.py")
            if inspect.isfunction(getattr(importlib.import_module(mod), name))}


def _computes(path: Path) -> list[str]:
    """What a rendering module imports that computes part of the report: a pipeline stage, or the
    pipeline itself."""
    stages = _pipeline_stages()
    return sorted(f"{mod}.{name}" for mod, name in _imported_from_specdiff(path)
                  if (mod, name) in stages or mod == "specdiff.replay.diff.pipeline"
                  or (mod, name) == ("specdiff.replay.diff", "pipeline"))


def test_the_report_only_renders_it_imports_no_pipeline_stage():
    # The diff pipeline (replay/diff/pipeline.py) builds the report; report.py renders it and
    # result.py holds it. Neither may compute a stage again, lazily or not.
    assert ("specdiff.replay.diff.compare.compare", "compare_all") in _pipeline_stages()
    assert _computes(DIFF / "report.py") == []
    assert _computes(DIFF / "result.py") == []


def test_the_render_check_catches_a_stage_imported_into_the_report(tmp_path):
    # The check itself must be able to fail: a renderer that explains on its own is reported.
    bad = tmp_path / "report.py"
    bad.write_text("def render(report):\n    from specdiff.replay.diff.explain import explain\n"
                   "    from specdiff.replay.diff.pipeline import diff_opened\n")
    assert _computes(bad) == ["specdiff.replay.diff.explain.explain", "specdiff.replay.diff.pipeline.diff_opened"]


#: modules of tracer/engines no single engine owns: the boundary and the trace writers (record train's too)
SHARED = ("base", "writer")


def _engine_module_imports(pkg: str) -> list[str]:
    """``path:line module`` of every import of an engine's own modules (``specdiff.tracer.engines.<e>``)."""
    out = []
    for path in sorted((ROOT / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for mod in mods:
                parts = mod.split(".")
                if parts[:3] == ["specdiff", "tracer", "engines"] and len(parts) > 3 and parts[3] not in SHARED:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {mod}")
    return out


def test_offline_code_reaches_an_engine_only_through_the_engine_boundary():
    # replay/ runs without any engine installed: it may use tracer.engines (the registry),
    # tracer.engines.base and the trace writers, never an engine's recorder modules.
    assert _engine_module_imports("replay") == []


def test_the_engine_registry_is_the_one_source_of_each_engines_identity():
    # eagle3.engines names every engine once: the adapters, pre-flight, the CLI's choices, the
    # check's labels and the entry points SGLang / vLLM load all read it.
    import click

    from specdiff.eagle3 import aux_layers, config_keys
    from specdiff.eagle3.engines import ENGINES, REGISTRY, engine_spec
    from specdiff.replay.preflight.engines import ENGINE_NAME
    from specdiff.tracer import crash
    from specdiff.tracer.engines.base import CPU_LAUNCHERS
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.vllm.adapter import VLLMAdapter
    from specdiff.tui import cmd_check, cmd_demo, cmd_record

    assert ENGINES == tuple(sorted(REGISTRY)) == ("sglang", "vllm")
    adapters = {a.spec.name: a("0") for a in (SGLangAdapter, VLLMAdapter)}
    toml = (ROOT / "pyproject.toml").read_text()
    for name, spec in REGISTRY.items():
        a = adapters[name]
        assert (a.engine, a.title, a.tested_range) == (spec.name, spec.title, spec.tested_range)
        assert ENGINE_NAME[name] == spec.title and cmd_check._LABEL[name] == spec.label
        assert f'[project.entry-points."{spec.plugin_group}"]\nspecdiff = "{spec.plugin}"' in toml
        assert name in CPU_LAUNCHERS and name in aux_layers.RULES
        assert {r for e, r in config_keys.ENGINE_ID_KEYS if e == name} == set(spec.runners or (None,))
    assert crash._ENGINE_PACKAGES == ENGINES
    for command, option, extra in ((cmd_record.serve, "engine", []), (cmd_demo.demo, "engine", []),
                                   (cmd_check.check, "engine", ["all"])):
        opt = next(p for p in command.params if p.name == option)
        assert isinstance(opt.type, click.Choice) and list(opt.type.choices) == [*ENGINES, *extra], command.name
    with pytest.raises(ValueError, match="unknown serving engine 'tgi'"):
        engine_spec("tgi")


def test_no_test_edits_sys_path():
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("*.py"))
                 if "sys.path" in p.read_text() and p.name != Path(__file__).name]
    assert offenders == []


@pytest.mark.skipif(not (EXAMPLE / "serve.trace").exists(), reason="the shipped example pair is absent")
def test_diff_of_the_example_pair_is_byte_identical_to_the_golden_json(assert_golden_seed_diff):
    # The golden file is `specdiff diff ... --format json` on the shipped seed pair, computed by
    # the code before the issue-13 redesign (commit fb78f8e) on a clean clone: the model paths the
    # traces name do not exist here, so no pre-flight findings. Regenerated once since, when the
    # per-row dot products moved from einsum to np.vecdot (issue 14): min_cos / max_rel changed in
    # their last float32 digits (1-3 ulp), nothing else. Regenerated when the pair was re-recorded
    # by traces/examples/regenerate.py with repo-relative paths (issue 23): the models the traces
    # name now exist on a clean clone, so the report holds pre-flight findings. Changed by hand once
    # more with one string: the aux_hf_indices fix names SGLang's per-family numbering. Otherwise
    # regenerate it only when the example pair itself is re-recorded.
    result = subprocess.run(
        [sys.executable, "-m", "specdiff.tui", "diff", "traces/examples/seed/train.trace",
         "traces/examples/seed/serve.trace", "--format", "json"],  # relative: the JSON names them
        capture_output=True, cwd=ROOT, timeout=300)
    assert result.returncode == 1, result.stderr.decode()[-2000:]
    assert_golden_seed_diff(result.stdout)  # byte-identical, or a few float32 ulp on another CPU

