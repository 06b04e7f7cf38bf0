"""Mistakes no scenario names, on a real SGLang 0.5.23 server (CPU), found as a new user would:
`record serve` / `record client`, `record train`, `diff`.

- The EAGLE-3 demo draft served with ``--speculative-algorithm EAGLE``: SGLang feeds the draft one
  final hidden state [H] instead of three aux states [3H]. The diff used to die with
  ``ValueError: target.aux_cat: row shapes differ``; now it is a ``structure`` divergence that
  names the algorithm, exit 1.
- The training side recorded from the training data format (BOS + raw text, ``--max-new-tokens
  64``) and the server used through ``/v1/chat/completions`` (its chat template, no BOS): the
  first divergence is ``tokens`` at position 0 with the decoded difference, exit 1 — not advice to
  re-record that hides the bug.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.demo.scenarios import write_served_draft
from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)

CHAT_TEMPLATE = ("{% for m in messages %}User: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}Assistant:{% endif %}")


def specdiff(*args, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdiff.tui", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def diff_json(train: Path, serve: Path) -> tuple[subprocess.CompletedProcess, dict]:
    proc = specdiff("diff", train, serve, "--format", "json")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc, json.loads(proc.stdout)


def test_eagle3_draft_served_with_algorithm_eagle_is_a_structure_divergence(tmp_path):
    served = write_served_draft("correct", REPO_MODELS / "draft", tmp_path / "served-draft")
    serve = tmp_path / "serve.trace"
    env = dict(os.environ, SPECDIFF_TRACE=str(serve))
    with ServerProcess(REPO_MODELS / "target", draft_model_path=served, spec=SpecSettings(algorithm="EAGLE"),
                       env=env, log_path=tmp_path / "server.log") as server:
        for ids in demo_prompts(REPO_MODELS, 2):
            out = server.generate(input_ids=ids, max_new_tokens=16)
            assert out["meta_info"]["completion_tokens"] == 16  # SGLang serves it, silently
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", REPO_MODELS / "target", "--draft", REPO_MODELS / "draft",
                   "--replay", serve, "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    proc, report = diff_json(train, serve)
    assert proc.returncode == 1, proc.stderr[-2000:]
    first = report["first_divergence"]
    assert first["kind"] == "structure"
    assert first["tensor"] in ("target.aux.0", "target.aux.1", "target.aux.2", "target.aux_cat"), first
    cause = report["explanations"][0]
    assert cause["cause"] == "speculative_algorithm"
    assert "--speculative-algorithm EAGLE" in cause["message"] and "ONE hidden state 256 wide" in cause["message"]
    assert any("never ran fc" in line for line in cause["evidence"])
    text = specdiff("diff", train, serve, "--format", "text")
    assert text.returncode == 1 and text.stdout.startswith("first divergence: target.aux")
    # `specdiff fix`: a server option, so the draft as it was, served as EAGLE3 (replay/fix/plan.py OPTION_PLANNERS)
    fix = specdiff("fix", train, serve, "-o", tmp_path / "fixed", "--format", "json")
    assert fix.returncode == 0, fix.stderr[-2000:]
    done = json.loads(fix.stdout)
    assert done["options"] == [{"flag": "--speculative-algorithm", "old": "EAGLE", "new": "EAGLE3"}], done
    assert done["config"] == done["tensors"] == []


def test_training_data_format_against_chat_completions_is_a_tokens_divergence(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(REPO_MODELS / "target", target)
    cfg_path = target / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE  # the committed tiny tokenizer has none
    cfg_path.write_text(json.dumps(cfg, indent=2))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    texts = [tok.decode(ids[1:]) for ids in demo_prompts(REPO_MODELS, 2)]  # held-out prompts, BOS dropped
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))

    served = write_served_draft("correct", REPO_MODELS / "draft", tmp_path / "served-draft")
    serve = tmp_path / "serve.trace"
    env = dict(os.environ, SPECDIFF_TRACE=str(serve))
    with ServerProcess(target, draft_model_path=served, spec=SpecSettings(), env=env,
                       log_path=tmp_path / "server.log") as server:
        client = specdiff("record", "client", "--url", server.url, "--prompts", prompts, "--chat",
                          "--max-new-tokens", 16)
        assert client.returncode == 0, client.stderr[-2000:]
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", target, "--draft", REPO_MODELS / "draft", "--prompts", prompts,
                   "--max-new-tokens", 64, "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    proc, report = diff_json(train, serve)
    assert proc.returncode == 1, proc.stderr[-2000:]
    first = report["first_divergence"]
    assert (first["tensor"], first["kind"], first["pos"]) == ("tokens", "tokens", 0), first
    cause = report["explanations"][0]
    assert cause["cause"] == "token_format"
    assert "BOS (id 0) added on training only" in cause["message"]
    assert "role markers / a chat template prefix: 'User:" in cause["message"]  # decoded
    assert sum(s["format"] is not None for s in report["sequences"]) == 2
    text = specdiff("diff", train, serve, "--format", "text")
    print(text.stdout)  # the report a user reads, kept in the test log
    assert text.returncode == 1 and text.stdout.startswith("first divergence: tokens at seq 0 pos 0")
