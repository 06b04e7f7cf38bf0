"""Prompt files (JSONL) for `record client` and `record train`: values per line, one-line errors."""

from __future__ import annotations

import pytest

from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.jsonl import iter_jsonl


def test_values_with_line_numbers_and_blank_lines_skipped(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "a"}\n\n"b"\n')
    assert list(iter_jsonl(f)) == [(1, {"text": "a"}), (3, "b")]


def test_a_line_that_is_not_json_names_file_and_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "a"}\n{oops\n')
    with pytest.raises(SpecdiffError) as err:
        list(iter_jsonl(f))
    assert str(err.value) == f"{f}:2: not JSON (Expecting property name enclosed in double quotes)"


def test_an_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(SpecdiffError) as err:
        list(iter_jsonl(tmp_path / "missing.jsonl"))
    assert str(err.value) == f"{tmp_path / 'missing.jsonl'}: cannot read prompts (No such file or directory)"
