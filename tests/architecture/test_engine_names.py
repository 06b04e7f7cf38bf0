"""Engines are named once: what differs between the serving engines is a column of
eagle3/engines.py ``EngineSpec`` (the fc-width site a crash cites, the server options a fix may write,
the title, whether the target's rule reads the aux ids, the norm a later draft layer reads, the error
a missing aux slot raises, ...), read where it is needed; only eagle3/ and tracer/engines/<engine>/
compare a value to an engine's name.

``LEFT`` held the comparisons that stood when this check was written (review 5 counted 136 literal
uses, 37 of them comparisons), per module; each became a column read, so it is empty and any module
comparing a value to an engine name fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

from specdiff.eagle3.engines import ENGINES

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("eagle3", "tracer", "replay", "demo", "tui", "demo_models")
#: module -> engine-name comparisons still in it (to become EngineSpec columns); may only fall: none is left
LEFT: dict[str, int] = {}


def _names(node: ast.AST) -> set[str]:
    """The engine names ``node`` spells: a string constant, or one inside a literal tuple, list or set."""
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {e.value for e in elts if isinstance(e, ast.Constant) and e.value in ENGINES}


def engine_name_comparisons(root: Path) -> dict[str, list[int]]:
    """module path -> lines where a value is compared (``==``, ``!=``, ``in``, ...) to an engine name,
    for every product module under ``root`` outside eagle3/ and tracer/engines/<engine>/."""
    own = ("eagle3/", *(f"tracer/engines/{e}/" for e in ENGINES))
    out: dict[str, list[int]] = {}
    for pkg in PRODUCT:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(own):
                continue
            lines = [n.lineno for n in ast.walk(ast.parse(path.read_text(), filename=str(path)))
                     if isinstance(n, ast.Compare) and any(_names(x) for x in (n.left, *n.comparators))]
            if lines:
                out[rel] = lines
    return out


def test_no_module_outside_the_engine_folders_compares_to_an_engine_name_beyond_what_is_left():
    found = engine_name_comparisons(ROOT)
    assert {m: lines for m, lines in found.items() if len(lines) > LEFT.get(m, 0)} == {}


def test_the_check_finds_a_comparison_and_not_a_name_read_from_a_spec(tmp_path):
    (tmp_path / "tui").mkdir()
    (tmp_path / "tui" / "probe.py").write_text(
        "def f(engine, spec):\n"
        "    if engine == 'vllm':\n"
        "        return 1\n"
        "    keys = {'sglang': 2}\n"  # a table keyed by name: not a comparison
        "    return spec.title if engine in ('sglang', 'other') else keys\n")
    (tmp_path / "eagle3").mkdir()
    (tmp_path / "eagle3" / "own.py").write_text("def g(e):\n    return e == 'sglang'\n")
    assert engine_name_comparisons(tmp_path) == {"tui/probe.py": [2, 5]}
