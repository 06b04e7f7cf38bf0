"""Every bad value of every command's options and arguments is one line on stderr and exit 2:
a table over the real CLI, one row per bad input, each asserting the exit code, that
the output is exactly one non-empty line (no traceback, no click usage block) and what the line
says. Plus the exit-code table the help and README show.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def paths(tmp_path_factory, aux_traces) -> dict[str, str]:
    """Placeholders of the table: a diverging synthetic pair (``a`` training, ``b`` serving), a file,
    an empty folder, a missing path, a prompts file, a scratch folder."""
    root = tmp_path_factory.mktemp("cli-errors")
    (root / "afile").write_text("not a trace\n")
    (root / "empty").mkdir()
    (root / "p.jsonl").write_text('{"text": "def f():"}\n')
    return {"a": aux_traces.write(root / "a.trace", side="train", hf=[0, 3, 6]),
            "b": aux_traces.write(root / "b.trace", side="serve", hf=[3, 6, 7]),
            "file": str(root / "afile"), "empty": str(root / "empty"), "missing": str(root / "missing"),
            "prompts": str(root / "p.jsonl"), "tmp": str(root), "tmp_name": root.name}


#: (argv with {placeholders}, what the one line says: a regex searched after "specdiff: error: ")
BAD_INPUT = [
    # click's own checks: one line naming the option and the values it takes, not a usage block
    ("diff {a} {b} --preset nope", r"^invalid value for '--preset': 'nope' is not one of 'strict', 'default', "
                                   r"'loose'; see 'specdiff diff --help'$"),
    ("diff {a} {b} --format xml", r"invalid value for '--format': 'xml' is not one of 'text', 'json'"),
    ("diff {a} {b} --workers 0", r"invalid value for '--workers': 0 is not in the range x>=1"),
    ("diff {a}", r"^missing argument 'TRACE_B'; see 'specdiff diff --help'$"),
    ("diff {a} {b} {b}", r"unexpected extra argument"),
    ("diff {a} {b} --bogus", r"no such option '--bogus'"),
    ("nosuchcommand", r"^no such command 'nosuchcommand'; see 'specdiff --help'$"),
    ("--bogus", r"^no such option '--bogus'; see 'specdiff --help'$"),
    ("view {a} {b} --preset nope", r"'nope' is not one of 'strict', 'default', 'loose'; see 'specdiff view --help'"),
    ("watch --serve {b} --draft {empty} --target {empty} --window 0", r"'--window': 0 is not in the range x>=1"),
    ("record serve --engine x -- m", r"invalid value for '--engine': 'x' is not one of 'sglang', 'vllm'"),
    ("record serve --logits-topk 0 -- m", r"'--logits-topk': 0 is not in the range x>=1"),
    ("record serve --sample 2 -- m", r"'--sample': 2.0 is not in the range 0.0<x<=1.0"),
    ("record client --url http://127.0.0.1:9 --prompts {prompts} --concurrency 0",
     r"'--concurrency': 0 is not in the range x>=1"),
    ("record client --url http://127.0.0.1:9 --prompts {prompts} --temperature -1",
     r"'--temperature': -1.0 is not in the range x>=0.0"),
    ("record client --url http://127.0.0.1:9 --prompts {prompts} --max-new-tokens 0",
     r"'--max-new-tokens': 0 is not in the range x>=1"),
    # tolerance overrides: each field in its range (rel:-1 and max_fail_frac:1.5 were accepted)
    ("diff {a} {b} --tol draft.fc_out=rel:-1", r"'draft.fc_out=rel:-1': rel must be >= 0, not -1$"),
    ("diff {a} {b} --tol draft.fc_out=max_fail_frac:1.5", r"max_fail_frac must be in \[0, 1\], not 1.5$"),
    ("diff {a} {b} --tol draft.fc_out=cos:nan", r"cos must be in \[-1, 1\], not nan$"),
    ("diff {a} {b} --tol draft.fc_out=ids:2", r"ids must be in \[0, 1\], not 2$"),
    ("view {a} {b} --tol target.aux=rel:-0.5", r"rel must be >= 0, not -0.5$"),
    ("diff {a} {b} --tol nonsense", r"'nonsense' is not of the form STAGE=rel:0.1,cos:0.99"),
    ("diff {a} {b} --tol draft.nothing=rel:0.1", r"names 'draft.nothing', not a stage"),
    ("diff {a} {b} --tol draft.fc_out=rel:x", r"'x' is not a number"),
    ("diff {a} {b} --workers 2 --dask tcp://127.0.0.1:1", r"not both"),
    # paths
    ("diff {missing} {b}", r"missing: no such trace \(the path does not exist\)$"),
    ("diff {file} {b}", r"afile: not a specdiff trace"),
    ("diff {a} {b} -o {missing}/r.json", r"^-o .*/r.json: folder .*missing does not exist; create it"),
    ("diff {a} {b} -o {empty}", r"^-o .*empty: is a folder; give a file path$"),
    ("info {missing}", r"no such trace"),
    ("info {empty}", r"not a specdiff trace"),
    ("view {empty} {b}", r"not a specdiff trace"),
    ("upgrade {a} {missing}/x.trace", r"x.trace: folder .*missing does not exist; create it or choose another path$"),
    ("upgrade {a} {b}", r"b.trace: already exists; choose another path$"),
    ("upgrade {missing} {tmp}/u.trace", r"no such trace"),
    ("record client --url localhost:1 --prompts {prompts}",
     r"^--url localhost:1: give the server's URL with its scheme, e.g. http://localhost:1$"),
    ("record client --url http://127.0.0.1:9 --prompts {missing}", r"cannot read prompts"),
    # no server at the URL was "the server at URL died during request 0"
    ("record client --url http://127.0.0.1:9 --prompts {prompts}",
     r"^no server answers at http://127.0.0.1:9 \(Connection refused\); start it first \(specdiff record serve "
     r"\.\.\. -- SERVER ARGS\) or check --url$"),
    # a trace against itself agreed by construction, a silent exit 0
    ("diff {a} {a}", r"^TRACE_A and TRACE_B are the same trace \(.*a\.trace\): a trace always agrees with itself; "
                     r"give the training trace and the serving trace$"),
    ("diff {a} {tmp}/./a.trace", r"the same trace"),
    ("view {b} {tmp}/../{tmp_name}/b.trace", r"the same trace"),
    ("demo --workdir {file} --no-tui", r"^--workdir .*afile: cannot create .*afile/seed \(Not a directory\)$"),
    # no terminal: view refuses rather than waiting for keys that never come
    ("view {a} {b}", r"^view needs a terminal \(the app reads keys from stdin and draws on stderr\); for the "
                     r"report without one: specdiff diff TRACE_A TRACE_B --format text$"),
]


def _one_line(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert "Traceback" not in result.output and len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize(("argv", "says"), BAD_INPUT, ids=[a for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(run_cli, paths, argv, says):
    r = run_cli(*[part.format(**paths) for part in argv.split()])
    line = _one_line(r)
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert line.startswith("specdiff: error: ") and re.search(says, line.removeprefix("specdiff: error: ")), line


def test_check_on_aux_ids_written_as_a_string_is_one_line_naming_the_list(run_cli, repo_models, tmp_path):
    # eagle_config's ids as "2,5,6" were a ValueError traceback from int(",")
    draft = tmp_path / "draft"
    shutil.copytree(repo_models / "draft", draft)
    config = json.loads((draft / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = "2,5,6"
    (draft / "config.json").write_text(json.dumps(config))
    r = run_cli("check", "--target", repo_models / "target", "--draft", draft, "--engine", "sglang")
    assert r.exit_code == 2
    assert _one_line(r).endswith("eagle_config.eagle_aux_hidden_state_layer_ids: is '2,5,6', not a list of "
                                 "integers; fix: write a JSON list of integers, e.g. [2, 5, 6]")


def test_record_train_and_watch_refuse_a_device_before_loading_a_model(run_cli, paths, repo_models):
    # --device nope was a torch RuntimeError traceback after both models had loaded
    r = run_cli("record", "train", "--target", repo_models / "target", "--draft", repo_models / "draft",
                "--replay", paths["b"], "-o", f"{paths['tmp']}/t.trace", "--device", "nope")
    assert r.exit_code == 2 and _one_line(r) == ("specdiff: error: --device 'nope': not a torch device; "
                                                 "use cpu, cuda or cuda:N")
    r = run_cli("watch", "--serve", paths["b"], "--draft", repo_models / "draft", "--target", repo_models / "target",
                "--once", "--out", f"{paths['tmp']}/w", "--device", "cuda:99")
    assert r.exit_code == 2 and re.fullmatch(r"specdiff: error: --device cuda:99: this machine has \d+ CUDA "
                                             r"device\(s\); use --device cpu.*", _one_line(r))


def test_watch_refuses_missing_models_and_trace_before_it_starts(run_cli, paths, repo_models):
    # each was a "watching ..." line, then the error when the first request loaded the models
    r = run_cli("watch", "--serve", paths["b"], "--draft", paths["empty"], "--target", repo_models / "target",
                "--once", "--out", f"{paths['tmp']}/w2")
    assert r.exit_code == 2 and _one_line(r).endswith("empty: no config.json (a local Hugging Face model "
                                                      "directory is needed)")
    r = run_cli("watch", "--serve", paths["missing"], "--draft", repo_models / "draft",
                "--target", repo_models / "target", "--once", "--out", f"{paths['tmp']}/w3")
    assert r.exit_code == 2 and _one_line(r).endswith("missing: no such trace (the path does not exist)")


def test_a_server_that_exits_before_tracing_is_an_error_not_exit_0(run_cli, tmp_path, monkeypatch):
    # SGLang refusing its arguments (argparse: no traceback, exit 2) left `record serve` saying
    # "server exited (2)" with exit 0
    import sys

    from specdiff.tui import cmd_record

    refuse = "import sys; print('sglang serve: error: the following arguments are required: --model-path', " \
             "file=sys.stderr); sys.exit(2)"
    monkeypatch.setattr(cmd_record, "serve_command", lambda engine, args, cpu, env: ([sys.executable, "-c", refuse],
                                                                                    env))
    r = run_cli("record", "serve", "--trace", tmp_path / "t.trace", "--", "--bogus")
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines()[-1] == (
        "specdiff: error: the SGLang server exited (2) before it served: sglang serve: error: the following "
        "arguments are required: --model-path; no trace was written (fix what SGLang says, then run again)")


def test_the_help_and_the_readme_list_every_exit_code(run_cli):
    from specdiff.tui.cli import EXIT_CODES

    codes = [code for code, _ in EXIT_CODES if code is not None]
    assert codes == [0, 1, 2, 130]
    help_text = run_cli("--help").output
    readme = (ROOT / "README.md").read_text()
    for code in codes:
        assert re.search(rf"^ +{code} +\S", help_text, re.M), help_text
        assert re.search(rf"^\| {code} \| ", readme, re.M), f"README's exit-code table lacks {code}"
