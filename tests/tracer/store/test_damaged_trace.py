"""A damaged trace is named, not a traceback: every kind of store damage, on a copy of the shipped
example pair (traces/examples/seed), gives one line naming the tensor, the chunk and what to do, in
`specdiff info --verify`, `specdiff diff` and the app; everything else is still read and compared.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_json
from specdiff.replay.diff.types import UNREADABLE
from specdiff.tracer.errors import TraceError
from specdiff.tracer.store import TraceWriter, open_trace
from specdiff.tracer.store import layout as store_layout
from specdiff.tracer.store.arrays import STORAGE_DTYPES
from specdiff.tracer.store.damage import READABLE, RECOPY
from specdiff.tracer.store.upgrade import upgrade
from specdiff.tui.app import SpecdiffApp
from specdiff.tui.view import Sel

EXAMPLE = Path(__file__).resolve().parents[3] / "traces" / "examples" / "seed"
JSON_ERR = "not valid JSON: Expecting property name enclosed in double quotes: line 1 column 3 (char 2)"
CLOSED_FALLBACK = ("the trace was closed cleanly, so it is read from its zarr arrays (nothing lost); "
                   "copy the trace again to repair the journal")
pytestmark = pytest.mark.anyio


def _chunk(trace: Path, name: str, column: str = "data") -> Path:
    """The first chunk file (rows from 0) of a tensor's data or row-key column: c/0/0 for [row, dim],
    c/0 for [row]."""
    first = trace / "tensors" / name / column / "c" / "0"
    return first / "0" if first.is_dir() else first


def _journal_entry_starts(path: Path) -> list[int]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(path.read_bytes())
    ends = []
    for _ in unpacker:
        ends.append(unpacker.tell())
    return ends


# ---- the damage kinds: each damages a copy and returns the exact line it must produce --------
def chunk_cut_to_10_bytes(t: Path) -> str:
    f = _chunk(t, "target.aux.0")
    size = len(f.read_bytes())
    f.write_bytes(f.read_bytes()[:10])
    # a raw float chunk (the shipped pair's) has one length; blosc's header: see _old_trace
    return (f"{t}: tensor target.aux.0, chunk tensors/target.aux.0/data/c/0/0 is truncated (10 of {size} "
            f"bytes): rows 0-401 are unreadable and not compared; {RECOPY}")


def chunk_cut_in_half(t: Path) -> str:
    f = _chunk(t, "draft.hidden_out")
    last = _first_chunk_rows(t, "draft.hidden_out") - 1
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) // 2])
    return (f"{t}: tensor draft.hidden_out, chunk tensors/draft.hidden_out/data/c/0/0 is truncated "
            f"({len(raw) // 2} of {len(raw)} bytes): rows 0-{last} are unreadable and not compared; {RECOPY}")


def _first_chunk_rows(t: Path, name: str) -> int:
    """Rows held by the first chunk of ``name`` (read before the damage, from zarr itself)."""
    import zarr

    arr = zarr.open_array(str(t / "tensors" / name / "data"), mode="r")
    return min(arr.shape[0], arr.chunks[0])


def chunk_bytes_flipped(t: Path) -> str:
    f = _chunk(t, "draft.fc_out")
    raw = bytearray(f.read_bytes())
    for k in range(len(raw) // 2, len(raw) // 2 + 8):
        raw[k] ^= 0xFF
    f.write_bytes(bytes(raw))
    return (f"{t}: tensor draft.fc_out, chunk tensors/draft.fc_out/data/c/0/0 fails its crc32c checksum (its bytes "
            f"changed after writing): rows 0-401 are unreadable and not compared; {RECOPY}")


def chunk_file_deleted(t: Path) -> str:
    _chunk(t, "target.aux.2").unlink()
    return (f"{t}: tensor target.aux.2, chunk tensors/target.aux.2/data/c/0/0 is missing: rows 0-401 are "
            f"unreadable and not compared; {RECOPY}")


def chunk_unreadable(t: Path) -> str:
    f = _chunk(t, "target.aux_cat")
    f.unlink()
    f.symlink_to(f.name)  # a real OS error on read (ELOOP), as root can still read a chmod 000 file
    return (f"{t}: tensor target.aux_cat, chunk tensors/target.aux_cat/data/c/0/0 cannot be read (Too many levels "
            f"of symbolic links): rows 0-401 are unreadable and not compared; {READABLE}")


def key_chunk_flipped(t: Path) -> str:
    f = _chunk(t, "target.aux.1", "pos")
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    return (f"{t}: tensor target.aux.1, chunk tensors/target.aux.1/pos/c/0 fails its crc32c checksum (its bytes "
            f"changed after writing): the pos keys of rows 0-401 are unreadable, so those rows are not aligned or "
            f"compared; {RECOPY}")


def array_metadata_corrupt(t: Path) -> str:
    (t / "tensors" / "draft.logsumexp" / "data" / "zarr.json").write_text("{ bad")
    return (f"{t}: tensor draft.logsumexp, tensors/draft.logsumexp/data/zarr.json is corrupt ({JSON_ERR}): "
            f"rows 0-476 are unreadable and not compared; {RECOPY}")


def journal_truncated(t: Path) -> str:
    j = t / "journal.msgpack"
    raw = j.read_bytes()
    j.write_bytes(raw[: len(raw) // 2])
    return f"{t}: journal.msgpack is truncated ({len(raw) // 2} bytes, it ends before its close entry): {CLOSED_FALLBACK}"


def journal_corrupt(t: Path) -> str:
    j = t / "journal.msgpack"
    starts = _journal_entry_starts(j)
    at = starts[len(starts) // 2]
    raw = bytearray(j.read_bytes())
    raw[at] = 0xC1  # a byte msgpack never uses
    j.write_bytes(bytes(raw))
    return f"{t}: journal.msgpack is corrupt at byte {at} (FormatError): {CLOSED_FALLBACK}"


def group_metadata_corrupt(t: Path) -> str:
    (t / "zarr.json").write_text("{ not json")
    return (f"{t}: zarr.json is corrupt ({JSON_ERR}): the trace's facts are read from its record journal "
            "(nothing lost); copy the trace again to repair it")


#: kind -> (damage, tensor whose rows it loses or None, found by `info` without --verify: at open, or
#: by the chunk files' sizes, no value read; a cut chunk was not, once)
KINDS = {
    "chunk cut to 10 bytes": (chunk_cut_to_10_bytes, "target.aux.0", True),
    "chunk cut in half": (chunk_cut_in_half, "draft.hidden_out", True),
    "chunk bytes flipped": (chunk_bytes_flipped, "draft.fc_out", False),
    "chunk file deleted": (chunk_file_deleted, "target.aux.2", True),
    "chunk unreadable": (chunk_unreadable, "target.aux_cat", False),
    "row-key chunk flipped": (key_chunk_flipped, None, False),
    "array zarr.json corrupt": (array_metadata_corrupt, "draft.logsumexp", True),
    "journal truncated": (journal_truncated, None, True),
    "journal corrupt": (journal_corrupt, None, True),
    "group zarr.json corrupt": (group_metadata_corrupt, None, True),
}


@pytest.fixture
def pair(tmp_path):
    dst = tmp_path / "seed"
    shutil.copytree(EXAMPLE, dst, symlinks=True)
    return dst / "train.trace", dst / "serve.trace"


@pytest.fixture(scope="module")
def clean_report():
    return diff_traces(str(EXAMPLE / "train.trace"), str(EXAMPLE / "serve.trace"))


@pytest.mark.parametrize("kind", list(KINDS))
def test_info_verify_lists_each_damaged_part_in_one_line(pair, kind, run_cli):
    damage, _, at_open = KINDS[kind]
    line = damage(pair[1])
    res = run_cli("info", "--verify", str(pair[1]))
    assert res.exit_code == 1, res.output
    assert "damage     1 damaged part\n" in res.output
    assert f"\n  {line}\n" in res.output + "\n"
    assert "Traceback" not in res.output
    plain = run_cli("info", str(pair[1]))  # without --verify: what opening and the files' sizes show
    assert (f"\n  {line}" in plain.output) == at_open
    assert plain.exit_code == (1 if at_open else 0)
    if not at_open:
        assert plain.output.rstrip().endswith("(`specdiff info --verify` reads every chunk)")


def test_info_verify_on_the_intact_example_says_every_chunk_was_checked(run_cli):
    res = run_cli("info", "--verify", str(EXAMPLE / "serve.trace"))
    assert res.exit_code == 0
    assert res.output.rstrip().endswith("damage     none: every chunk was read and checked")


@pytest.mark.parametrize("kind", list(KINDS))
def test_diff_names_the_damage_and_compares_everything_else(pair, kind, clean_report, run_cli):
    damage, lost, _ = KINDS[kind]
    line = damage(pair[1])
    res = run_cli("diff", str(pair[0]), str(pair[1]), "--format", "text")
    assert res.exit_code == 1, res.output
    out = res.output.splitlines()
    # the damage block's first part (its continuation lines, wrapped at the width, are indented deeper)
    block = res.output.split("\ndamage\n", 1)[1].split("\n\n", 1)[0]
    assert " ".join(re.split(r"\n  (?! )", block)[0].split()) == line
    assert "Traceback" not in res.output
    report = diff_traces(str(pair[0]), str(pair[1]))
    assert [d.message() for d in report.damage] == [line]
    for name, clean in clean_report.comparisons.items():
        comp = report.comparisons[name]
        if name == lost:
            assert (comp.status == UNREADABLE).all() and comp.stats["unreadable_rows"] == comp.stats["rows"]
            tensor_line = next(s for s in out if s.startswith(f"  {name} "))
            d = report.damage[0]
            assert tensor_line.startswith(f"  {name:26s} DAMAGED ")
            assert tensor_line.endswith(f"; {comp.stats['rows']} rows unreadable: serving chunk {d.key} {d.problem}; "
                                        f"{d.action}")
        elif kind == "row-key chunk flipped" and name == "target.aux.1":
            assert comp.stats["rows"] == 0  # serving rows cannot be placed: none aligned
        elif lost == "draft.logsumexp" and name == "draft.logits_topk.ids":  # KL needs the logsumexp
            assert "kl_mean" not in comp.stats
            assert comp.stats == {k: v for k, v in clean.stats.items() if not k.startswith("kl_")}
        else:  # nothing else lost
            assert comp.stats == clean.stats, name
            assert np.array_equal(comp.status, clean.status)
    first = "target.aux.1" if lost == "target.aux.0" else "target.aux.0"
    assert report.first.name == first and report.verdict().startswith(f"first divergence: {first} at seq 0 pos 0")
    assert report.verdict().endswith("; see damage)")
    as_json = json.loads(render_json(report))  # what `diff --format json` prints
    assert [d["message"] for d in as_json["damage"]] == [line] and as_json["incomplete"] == bool(lost or "key" in kind)


def test_a_damaged_copy_is_never_reported_equivalent_to_its_original(tmp_path, run_cli):
    copy = tmp_path / "copy.trace"
    shutil.copytree(EXAMPLE / "train.trace", copy)
    f = _chunk(copy, "draft.fc_out")
    f.write_bytes(f.read_bytes()[:10])
    res = run_cli("diff", str(EXAMPLE / "train.trace"), str(copy), "--format", "text")
    assert res.exit_code == 1
    assert " ".join(res.output.split("\n\n", 1)[0].split()) == (
        "no divergence in the rows that could be read, but the traces are damaged (1 damaged part, 405 recorded "
        "rows unreadable), so equivalence is not shown; see damage")


def test_a_damaged_journal_of_a_closed_trace_loses_nothing_and_says_so(tmp_path, run_cli):
    copy = tmp_path / "copy.trace"
    shutil.copytree(EXAMPLE / "train.trace", copy)
    journal_corrupt(copy)
    res = run_cli("diff", str(EXAMPLE / "train.trace"), str(copy), "--format", "text")
    assert res.exit_code == 0  # every recorded value was read from zarr: equivalent, with the warning
    assert " ".join(res.output.split("\n\n", 1)[0].split()).endswith("(damaged traces: 1 damaged part, nothing lost; see damage)")
    a, b = open_trace(str(EXAMPLE / "train.trace")), open_trace(str(copy))
    assert [(s.id, s.tokens.tolist(), s.prompt_len, s.rid) for s in a.sequences] == \
        [(s.id, s.tokens.tolist(), s.prompt_len, s.rid) for s in b.sequences]
    assert a.contract == b.contract and a.names == b.names and a.records == b.records
    assert all(np.array_equal(a.read(n), b.read(n), equal_nan=True) for n in a.names)


FILE_KINDS = ("journal truncated", "journal corrupt", "group zarr.json corrupt")


def _explain_has(tui, app, lines) -> None:
    explain = " ".join(tui.static_text(app, "#explain-body").split())
    assert explain.startswith("Damage ")
    for line in lines:
        assert " ".join(line.split()) in explain, line


async def test_the_app_shows_each_chunk_damage_line_and_marks_unreadable_cells(pair, tmp_path, tui):
    lines = [group_metadata_corrupt(pair[0])]
    lines += [KINDS[k][0](pair[1]) for k in KINDS if k not in FILE_KINDS]  # one trace, many damaged parts
    app = SpecdiffApp(str(pair[0]), str(pair[1]), export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, lambda: app.vm is not None and app.sel is not None, timeout=180)
        _explain_has(tui, app, lines)
        assert "▒ unreadable" in tui.static_text(app, "#legend")
        assert app.vm.unreadable_pairs == {0, 1, 2}
        verdict = " ".join(tui.static_text(app, "#verdict").split())
        assert verdict.startswith("first divergence: ") and f"(damaged traces: {len(lines)} damaged parts, " in verdict
        for name, line in zip(("target.aux.0", "draft.hidden_out", "draft.fc_out", "target.aux.2", "target.aux_cat"),
                              lines[1:], strict=False):
            m = app.report.comparisons[name].match
            cell = Sel(name, int(m.depth[0]), int(m.pair[0]), int(m.pos[0]))
            app.select(cell)
            await pilot.pause()
            assert app.vm.cell(app.sel)[0] == UNREADABLE
            detail = " ".join(tui.static_text(app, "#detail-body").split())
            assert f"{name} seq {cell.pair} pos {cell.pos} depth {cell.depth} ▒ unreadable (damaged chunk)" in detail
            assert f"serving: {' '.join(line.split())}" in detail
        app.select(Sel("target.aux.1", 0, 0, 5))  # serving's row keys are damaged: the row cannot be placed
        await pilot.pause()
        detail = " ".join(tui.static_text(app, "#detail-body").split())
        assert "recorded by training only (or its row keys lie in a damaged chunk)" in detail
        assert f"serving: {' '.join(lines[6].split())}" in detail
        await pilot.press("q")
    assert app.return_code == 1


async def test_the_app_shows_journal_damage_and_still_finds_the_divergence(pair, tmp_path, tui):
    lines = [journal_truncated(pair[0]), journal_corrupt(pair[1])]
    app = SpecdiffApp(str(pair[0]), str(pair[1]), export_root=tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await tui.wait_for(pilot, lambda: app.vm is not None and app.sel is not None, timeout=180)
        _explain_has(tui, app, lines)
        assert "unreadable" not in tui.static_text(app, "#legend")  # nothing lost: no unreadable cell
        assert app.sel == Sel("target.aux.0", 0, 0, 0)
        assert " ".join(tui.static_text(app, "#verdict").split()).endswith(
            "(damaged traces: 2 damaged parts, nothing lost; see damage)")
        await pilot.press("q")
    assert app.return_code == 1


# ---- the store itself --------------------------------------------------------------------------
def test_a_damaged_chunk_costs_only_its_own_rows(tmp_path):
    path = tmp_path / "t"
    values = torch.arange(100 * 64, dtype=torch.float32).reshape(100, 64).to(torch.bfloat16)
    with TraceWriter(str(path), side="serve", chunk_bytes=64 * 2 * 16, overwrite=True) as w:
        w.append("draft.fc_out", values, seq=0, pos=np.arange(100))
    f = path / "tensors" / "draft.fc_out" / "data" / "c" / "2" / "0"  # rows 32-47
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[:-1])  # one byte short: raw float chunks all have one length
    trace = open_trace(str(path))
    got = trace.read("draft.fc_out")
    bad = trace.unreadable("draft.fc_out", np.arange(100))
    assert bad.nonzero()[0].tolist() == list(range(32, 48))
    assert np.isnan(got[bad]).all()
    assert np.array_equal(got[~bad], values.float().numpy()[~bad])
    assert np.array_equal(trace.take_float("draft.fc_out", np.array([50, 33, 2]))[[0, 2]],
                          values.float().numpy()[[50, 2]])
    assert [d.message() for d in trace.damage] == [
        f"{path}: tensor draft.fc_out, chunk tensors/draft.fc_out/data/c/2/0 is truncated ({size - 1} of {size} "
        f"bytes): rows 32-47 are unreadable and not compared; {RECOPY}"]


def _old_trace(path: Path, monkeypatch) -> Path:
    """A trace as written before chunk checksums (blosc only)."""
    with_crc = store_layout.compressors
    monkeypatch.setattr(store_layout, "compressors", lambda dtype: with_crc(dtype)[:1])
    # float data was blosc-compressed then, like every array
    monkeypatch.setattr(store_layout, "data_codecs", lambda name: with_crc(STORAGE_DTYPES[name])[:1])
    with TraceWriter(str(path), side="serve", chunk_bytes=64 * 2 * 16, overwrite=True) as w:
        w.add_sequence(np.arange(40), rid="r")
        w.append("draft.fc_out", torch.ones(40, 64, dtype=torch.bfloat16), seq=0, pos=np.arange(40))
    monkeypatch.undo()
    return path


def test_info_finds_a_cut_chunk_without_reading_a_value(pair, monkeypatch, run_cli):
    """`info` on a truncated chunk said "none found" unless --verify. The size check reads
    no chunk's values: zarr's decoding is never called."""
    import zarr

    from specdiff.tracer.store.chunks import ArrayReader

    line = chunk_cut_in_half(pair[1])
    reads = []
    for cls, name in ((zarr.Array, "__getitem__"), (ArrayReader, "read"), (ArrayReader, "take"),
                      (ArrayReader, "verify"), (ArrayReader, "_record")):
        monkeypatch.setattr(cls, name, lambda *a, name=name, **k: reads.append(name))
    damage = open_trace(str(pair[1])).check_sizes()
    assert [d.message() for d in damage] == [line] and reads == []


def test_a_cut_compressed_chunk_is_named_by_its_header_without_verify(tmp_path, monkeypatch, run_cli):
    path = _old_trace(tmp_path / "old", monkeypatch)  # blosc-compressed float data: no fixed chunk length
    f = path / "tensors" / "draft.fc_out" / "data" / "c" / "1" / "0"
    raw = f.read_bytes()
    f.write_bytes(raw[: len(raw) - 8])
    res = run_cli("info", str(path))
    assert res.exit_code == 1, res.output
    assert (f"  {path}: tensor draft.fc_out, chunk tensors/draft.fc_out/data/c/1/0 is truncated ({len(raw) - 8} of "
            f"{len(raw)} bytes): rows 16-31 are unreadable and not compared; {RECOPY}") in res.output


def test_traces_without_checksums_still_read_and_a_cut_chunk_is_still_named(tmp_path, monkeypatch):
    path = _old_trace(tmp_path / "old", monkeypatch)
    meta = json.loads((path / "tensors" / "draft.fc_out" / "data" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "blosc"]
    assert open_trace(str(path)).verify() == []
    f = path / "tensors" / "draft.fc_out" / "data" / "c" / "1" / "0"
    f.write_bytes(f.read_bytes()[:10])
    trace = open_trace(str(path))
    assert np.array_equal(trace.read("draft.fc_out")[:16], np.ones((16, 64), np.float32))
    assert [d.message() for d in trace.damage] == [
        f"{path}: tensor draft.fc_out, chunk tensors/draft.fc_out/data/c/1/0 is truncated (10 bytes, shorter than its "
        f"header): rows 16-31 are unreadable and not compared; {RECOPY}"]


def test_upgrade_adds_checksums_without_changing_a_value(tmp_path, monkeypatch):
    old = _old_trace(tmp_path / "old", monkeypatch)
    new = tmp_path / "new"
    assert upgrade(str(old), str(new)) > 0
    a, b = open_trace(str(old)), open_trace(str(new))
    assert np.array_equal(a.read("draft.fc_out"), b.read("draft.fc_out"))
    assert a.keys("draft.fc_out")["pos"].tolist() == b.keys("draft.fc_out")["pos"].tolist()
    meta = json.loads((new / "tensors" / "draft.fc_out" / "data" / "zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes", "blosc", "crc32c"]
    f = new / "tensors" / "draft.fc_out" / "data" / "c" / "0" / "0"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    f.write_bytes(bytes(raw))
    assert "fails its crc32c checksum" in open_trace(str(new)).verify()[0].message()
    with pytest.raises(TraceError, match="damaged, not upgraded"):
        upgrade(str(new), str(tmp_path / "again"))


def test_unclosed_trace_with_a_journal_cut_before_its_header_cannot_be_opened(tmp_path):
    path = tmp_path / "t"
    w = TraceWriter(str(path), side="serve", overwrite=True)
    w.append("tokens", np.array([1]), seq=0, pos=0)  # never closed: the journal is the only sequence table
    (path / "journal.msgpack").write_bytes((path / "journal.msgpack").read_bytes()[:5])
    with pytest.raises(TraceError) as err:
        open_trace(str(path))
    assert str(err.value) == (f"{path}: record journal is truncated before its header (5 bytes) and the writer "
                              "never closed the trace, so no other copy of its sequences exists; the trace cannot "
                              "be opened (re-record it)")


def test_rows_of_a_record_split_by_a_commit_survive_a_writer_that_never_closed(tmp_path):
    path = tmp_path / "t"
    w = TraceWriter(str(path), side="serve", chunk_bytes=32 * 2 * 16, overwrite=True)  # 16 rows a chunk
    w.add_sequence(np.arange(100), rid="r")
    for start in (0, 50):  # 100 rows pending -> 96 committed: the second record is split at row 96
        w.append("draft.hidden_out", torch.arange(start, start + 50, dtype=torch.float32)[:, None].repeat(1, 32),
                 seq=0, pos=np.arange(start, start + 50))
    trace = open_trace(str(path))
    assert not trace.closed and trace.rows("draft.hidden_out") == 100
    assert trace.read("draft.hidden_out")[:, 0].tolist() == list(range(100))
    assert trace.keys("draft.hidden_out")["pos"].tolist() == list(range(100))


def test_an_unreadable_accept_length_chunk_is_not_counted_as_acceptance(pair):
    f = _chunk(pair[1], "verify.accept_length")
    f.write_bytes(f.read_bytes()[:10])  # every serving verify record
    report = diff_traces(str(pair[0]), str(pair[1]))
    assert report.acceptance.y.mean_accept_length is None and report.acceptance.y.samples == 0
    assert report.acceptance.x.mean_accept_length is not None
    assert [d.tensor for d in report.damage] == ["verify.accept_length"]


def test_a_trace_whose_journal_and_group_metadata_are_both_damaged_is_one_error_line(pair, run_cli):
    at = journal_corrupt(pair[1]).split("is corrupt at byte ")[1].split(" ")[0]
    group_metadata_corrupt(pair[1])
    res = run_cli("info", str(pair[1]))
    assert res.exit_code == 2
    assert res.stderr == (f"specdiff: error: {pair[1]}: zarr.json is corrupt ({JSON_ERR}) and journal.msgpack is "
                          f"corrupt at byte {at} (FormatError), so no intact copy of the trace's facts is left; copy "
                          "the trace again from where it was recorded\n")


def test_opening_a_trace_lists_no_chunk_files_and_a_read_lists_only_its_tensor(pair, monkeypatch):
    """Finding missing chunk files lists the chunk directories; that waits until a tensor is read
    (or the trace's damage is asked for), so a diff's first answer does not pay for listing every
    chunk of a large trace. The missing chunk is still found: by the read that needs it."""
    from specdiff.tracer.store import chunks, open_trace

    listed: list[str] = []
    real = chunks._chunk_files
    monkeypatch.setattr(chunks, "_chunk_files", lambda root: listed.append(root) or real(root))
    line = chunk_file_deleted(pair[1])
    trace = open_trace(str(pair[1]))
    assert listed == []
    trace.read("target.aux.2")
    assert listed and all("/tensors/target.aux.2/" in root for root in listed)
    assert trace.unreadable("target.aux.2", np.arange(3)).all()
    assert [d.message() for d in trace.damage] == [line]
