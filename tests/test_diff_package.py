"""replay/diff stays a package of stage folders a newcomer can read: no module over 500 lines, and
its modules import one another at module level only, without a cycle (types.py and causes.py at the
bottom), so the import lines of a module say what it depends on."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIFF = ROOT / "replay" / "diff"
PREFIX = "specdiff.replay.diff"


def _module(path: Path) -> str:
    parts = path.relative_to(DIFF).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join((PREFIX, *parts))


def _diff_imports(tree: ast.AST, *, top_level: bool) -> list[tuple[int, str]]:
    """(line, module.name) of every import from a replay/diff module: the statements at module level,
    or those inside a function or class (``top_level=False``). A ``TYPE_CHECKING`` block's imports
    (annotations only) are neither."""
    if top_level:
        stmts = tree.body
    else:
        stmts = [n for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(f)]
    out = []
    for n in stmts:
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(PREFIX):
            out += [(n.lineno, f"{n.module}.{a.name}") for a in n.names]
        elif isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names if a.name.startswith(PREFIX)]
    return sorted(set(out))


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(DIFF.rglob("*.py"))}


def test_no_module_of_the_diff_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in DIFF.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_diff_modules_import_each_other_at_module_level_only():
    lazy = [f"{p.relative_to(ROOT)}:{line} {mod}" for p in sorted(DIFF.rglob("*.py"))
            for line, mod in _diff_imports(ast.parse(p.read_text()), top_level=False)]
    assert lazy == []


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for _, mod in _diff_imports(ast.parse(path.read_text()), top_level=True):
            while mod not in mods and "." in mod:
                mod = mod.rsplit(".", 1)[0]  # ``from pkg import name``: the name may be a function
            if mod in mods and mod != name:
                deps.add(mod)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle found by a depth-first walk (each as the modules along it)."""
    found, state = [], {}

    def walk(n, path):
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                found.append(path[path.index(d):] + [d])
            elif d not in state:
                walk(d, path + [d])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            walk(n, [n])
    return found


def test_the_diff_modules_import_without_a_cycle():
    graph = _graph()
    assert len(graph) > 30 and graph[f"{PREFIX}.types"] == set() and graph[f"{PREFIX}.causes"] == set()
    assert cycles(graph) == []


def test_the_checks_catch_a_cycle_and_a_function_level_import():
    # The checks must be able to fail.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    tree = ast.parse(f"def f():\n    from {PREFIX}.explain import explain\n")
    assert _diff_imports(tree, top_level=False) == [(2, f"{PREFIX}.explain.explain")]
