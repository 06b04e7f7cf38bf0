"""``specdiff record``'s command line without a server: the command and environment ``record serve``
runs SGLang with, its usage errors in one line, and the prompts file ``record client`` reads.
"""

from __future__ import annotations


def test_record_serve_command_and_env(tmp_path):
    from specdiff.tui.cmd_record import serve_command, trace_env

    env = trace_env(str(tmp_path / "t.trace"), "full", 4, "^r", True, base={"PATH": "/bin"})
    assert env["SPECDIFF_TRACE"].endswith("t.trace") and env["SPECDIFF_CAPTURE"] == "full"
    assert env["SPECDIFF_LOGITS_TOPK"] == "4" and env["SPECDIFF_RIDS"] == "^r" and env["SPECDIFF_EAGER_DRAFT"] == "1"
    argv, env2 = serve_command("sglang", ["--model-path", "M"], cpu=False, env=env)
    assert argv[1:] == ["-m", "sglang.launch_server", "--model-path", "M"] and env2 is env
    argv, env3 = serve_command("sglang", ["--model-path", "M"], cpu=True, env=env)
    assert argv[1].endswith("serve.py") and "--device" in argv and argv[-2:] == ["--model-path", "M"]
    assert env3["SGLANG_USE_CPU_ENGINE"] == "1" and env3["SPECDIFF_TRACE"] == env["SPECDIFF_TRACE"]


def test_record_cli_errors_are_one_line(tmp_path, run_cli):


    r = run_cli("record", "serve", "--cpu")
    assert r.exit_code == 2 and "no SGLang arguments" in r.output
    (tmp_path / "exists.trace").mkdir()
    r = run_cli("record", "serve", "--trace", str(tmp_path / "exists.trace"), "--", "--model-path", "M")
    assert r.exit_code == 2 and "already exists" in r.output
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "a"}\n{"nope": 1}\n')
    r = run_cli("record", "client", "--url", "http://127.0.0.1:9", "--prompts", str(bad))
    assert r.exit_code == 2 and "p.jsonl:2" in r.output


def test_read_prompts(tmp_path):
    from specdiff.tui.serve_http import read_prompts

    p = tmp_path / "p.jsonl"
    p.write_text('"plain"\n\n{"prompt": "b", "max_new_tokens": 3}\n{"input_ids": [1, 2]}\n')
    assert read_prompts(str(p)) == [{"text": "plain"}, {"prompt": "b", "max_new_tokens": 3}, {"input_ids": [1, 2]}]
