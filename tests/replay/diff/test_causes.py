"""replay/diff/causes.py lists every cause the diff can name, and names no cause the diff cannot.

The cause ids the code can produce are found by reading replay/diff's source (an AST scan, so a new
``Explanation("…")`` is found without running a diff that triggers it):

- the first argument of every ``Explanation(...)``: a string, an f-string (its literal prefix is a
  family, e.g. ``contract.``), or a loop variable over a literal table of tuples (explain/vocab.py);
- the string every ``cause`` property returns (the legitimate differences of judge/, groups);
- the ``"kind"`` of every crash cause (contract/crash.py), which becomes the explanation's cause;
- ``contract.<field>`` for every field contract/facts.py ``STAGE_CAUSES`` can name.

The demo scenarios' expected causes (demo/scenarios.py) must be rows too.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from specdiff.demo.scenarios import ENGINE_SCENARIOS, SCENARIOS
from specdiff.replay.diff.causes import CAUSES, KINDS, cause_row
from specdiff.replay.diff.contract.facts import STAGE_CAUSES
from specdiff.replay.diff.judge.context import ContextRows
from specdiff.replay.diff.judge.groups import Concentration
from specdiff.replay.diff.judge.routing import RoutingFlips
from specdiff.replay.diff.judge.topk_ties import TopkBoundaryTies
from specdiff.replay.diff.types import Explanation
from specdiff.tracer.schema import STAGE_ORDER

DIFF = Path(__file__).resolve().parents[3] / "replay" / "diff"


def _prefix(node: ast.expr) -> str | None:
    """A string constant's value; an f-string's literal head ending in '.' (a family, ``contract.``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        head = node.values[0].value
        return head if head.endswith(".") else None
    return None


def _loop_table(func: ast.AST, name: str) -> list[str]:
    """The ids a loop variable ``name`` takes in ``func``: ``for name, ... in table`` over a literal
    list of tuples ``table = [("id", ...), ...]``."""
    tables = {t.id: n.value for n in ast.walk(func) if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, (ast.List, ast.Tuple))}
    out = []
    for loop in (n for n in ast.walk(func) if isinstance(n, ast.For)):
        if not (isinstance(loop.target, ast.Tuple) and isinstance(loop.iter, ast.Name) and loop.iter.id in tables):
            continue
        at = [i for i, e in enumerate(loop.target.elts) if isinstance(e, ast.Name) and e.id == name]
        out += [_prefix(row.elts[at[0]]) for row in tables[loop.iter.id].elts if at and isinstance(row, ast.Tuple)]
    return [c for c in out if c]


def constructed(source: str) -> set[str]:
    """Every cause id (or family prefix) ``source`` can construct (module doc)."""
    tree = ast.parse(source)
    found: set[str] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.Module)):
            continue
        if isinstance(func, ast.FunctionDef) and func.name == "cause":
            found |= {p for r in ast.walk(func) if isinstance(r, ast.Return) and r.value is not None
                      and (p := _prefix(r.value))}
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            if getattr(call.func, "id", None) != "Explanation" or not call.args:
                continue
            arg = call.args[0]
            if (p := _prefix(arg)) is not None:
                found.add(p)
            elif isinstance(arg, ast.Name):
                found |= set(_loop_table(func, arg.id))
    for d in (n for n in ast.walk(tree) if isinstance(n, ast.Dict)):
        for k, v in zip(d.keys, d.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == "kind" and (p := _prefix(v)) is not None:
                found.add(p)
    return found


def _code_causes() -> set[str]:
    found: set[str] = set()
    for path in sorted(DIFF.rglob("*.py")):
        src = path.read_text()
        ids = constructed(src)
        if path.name == "crash.py" or "Explanation(" in src or "def cause(" in src:
            found |= ids
    return found


def _contract_causes() -> set[str]:
    fields = {f for facts in STAGE_CAUSES.values() for f in facts} | {"aux_dropped_ids"}
    return {f"contract.{f}" for f in fields}


def _scenario_causes() -> set[str]:
    scenarios = list(SCENARIOS.values()) + [s for by in ENGINE_SCENARIOS.values() for s in by.values()]
    return {s.expected_cause for s in scenarios if s.expected_cause}


def unlisted(ids: set[str]) -> set[str]:
    """The ids (family prefixes ``x.`` stand for any member) that no row of ``CAUSES`` answers for."""
    families = {r.cause for r in CAUSES if r.cause.endswith(".")}
    out = set()
    for c in ids:
        try:
            if c.endswith(".") and c not in families:
                raise KeyError(c)
            if not c.endswith("."):
                cause_row(c)
        except KeyError:
            out.add(c)
    return out


def test_the_scan_finds_the_causes_of_every_kind_of_construction():
    found = _code_causes()
    assert len(found) >= 30
    # a literal, a cause property, a loop over a table, an f-string family, a crash kind
    assert {"aux_layer_shift", "moe_routing_near_tie", "d2t_missing", "contract.", "preflight."} <= found


def test_every_cause_the_code_constructs_is_a_row():
    assert unlisted(_code_causes()) == set()


def test_every_contract_cause_is_a_row():
    assert unlisted(_contract_causes()) == set()


def test_every_expected_cause_of_the_demo_scenarios_is_a_row():
    expected = _scenario_causes()
    assert expected and unlisted(expected) == set()


def test_every_row_is_constructed_somewhere():
    found = _code_causes()
    assert [r.cause for r in CAUSES if r.cause not in found] == []


def test_rows_are_well_formed():
    ids = [r.cause for r in CAUSES]
    assert len(ids) == len(set(ids))
    stages = set(STAGE_ORDER) | {"*"}
    for r in CAUSES:
        assert r.kind in KINDS, r
        assert r.stages and set(r.stages) <= stages, r
        assert r.meaning, r


def test_the_check_fails_on_a_cause_no_row_lists():
    # The test must be able to fail: a new Explanation id without its row is reported, as is a
    # contract cause of a field that is no contract field.
    source = 'def check():\n    return [Explanation("made_up_cause", "msg"), Explanation(f"contract.{f}", "m")]\n'
    found = constructed(source)
    assert found == {"made_up_cause", "contract."}
    assert unlisted(found) == {"made_up_cause"}
    assert unlisted({"contract.no_such_field"}) == {"contract.no_such_field"}
    with pytest.raises(KeyError):
        cause_row("made_up_cause")


def test_every_named_cause_has_one_shape():
    # An explanation and every difference a judge names say a cause id, the tensor and a sentence,
    # each as a value (a field or a property), never as a method to call.
    for cls in (Explanation, RoutingFlips, ContextRows, TopkBoundaryTies, Concentration):
        fields = {f.name for f in dataclasses.fields(cls)}
        for attr in ("cause", "tensor", "message"):
            assert attr in fields or isinstance(getattr(cls, attr, None), property), (cls.__name__, attr)
