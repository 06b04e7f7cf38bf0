"""A real SGLang 0.5.23 CPU server with one test-owned serving bug put in, traced as a user traces it.

The bug plugin (tests/server/bug_plugins/specdiff_bug_plugins.py, its module doc says which kinds exist)
is loaded through SGLang's own ``sglang.srt.plugins`` entry point, like specdiff's recorder, and
``SPECDIFF_TEST_BUG`` picks one bug per server. ``serve_traced`` serves, ``record train --replay``
records the training side, ``diff_both`` diffs them in JSON and in text.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "server" / "bug_plugins"
#: the chunk size every bug server prefills with (the demo prompts, 27-46 tokens, take 2-3 chunks)
CHUNK = 16
NEW_TOKENS = 16


def specdiff(*args, timeout=900) -> subprocess.CompletedProcess:
    """``python -m specdiff.tui ARGS`` as a user runs it; output captured as text."""
    return subprocess.run([sys.executable, "-m", "specdiff.tui", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


#: the entry-point group each engine loads its plugins from in every process it starts: SGLang's
#: ``load_plugins`` (srt/plugins/__init__.py), vLLM's ``load_general_plugins`` (vLLM 0.32.0
#: plugins/__init__.py, called from v1/engine/core.py:129 and v1/worker/worker_base.py:276)
PLUGIN_GROUPS = {"sglang": "sglang.srt.plugins", "vllm": "vllm.general_plugins"}


def entry_point_dir(root: Path, engine: str = "sglang", module: str = "specdiff_bug_plugins") -> Path:
    """A ``<module>-0.dist-info`` under ``root`` that declares ``module:load`` in ``engine``'s plugin group
    (``PLUGIN_GROUPS``): with ``root`` and ``PLUGIN_DIR`` on the server's ``PYTHONPATH``,
    ``importlib.metadata`` finds it as it finds an installed plugin's. Returns ``root``."""
    info = root / f"{module}-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUPS[engine]}]\n{module} = {module}:load\n")
    return root


def serve_traced(tmp_path: Path, served_draft: Path, server_env, bug: str | None, *, prompts: int = 2,
                 repeats: int = 2, new_tokens: int = NEW_TOKENS, extra_args: tuple[str, ...] = (),
                 target: Path = REPO_MODELS / "target") -> tuple[Path, Path]:
    """Serve ``prompts`` demo prompts ``repeats`` times each (greedy, ``--chunked-prefill-size CHUNK``,
    bf16) with ``bug`` put in (None: the plugin loads and does nothing); ``extra_args`` go to the server
    as given. Returns the (train, serve) traces; the server's log is ``tmp_path / "server.log"``."""
    eps = entry_point_dir(tmp_path / "entry-points")
    serve = tmp_path / "serve.trace"
    env = server_env(SPECDIFF_TRACE=str(serve), PYTHONPATH=f"{eps}:{PLUGIN_DIR}")
    if bug:
        env["SPECDIFF_TEST_BUG"] = bug
    with ServerProcess(target, draft_model_path=served_draft, spec=SpecSettings(), env=env,
                       extra_args=["--chunked-prefill-size", str(CHUNK), "--dtype", "bfloat16", *extra_args],
                       log_path=tmp_path / "server.log") as server:
        for ids in demo_prompts(REPO_MODELS, prompts):
            for _ in range(repeats):
                out = server.generate(input_ids=ids, max_new_tokens=new_tokens)
                assert out["meta_info"]["completion_tokens"] == new_tokens
    train = tmp_path / "train.trace"
    rec = specdiff("record", "train", "--target", target, "--draft", REPO_MODELS / "draft",
                   "--replay", serve, "-o", train)
    assert rec.returncode == 0, rec.stderr[-2000:]
    return train, serve


def diff_both(train: Path, serve: Path) -> tuple[subprocess.CompletedProcess, dict, str]:
    """``diff --format json`` (the process and its report) and the text report (printed: kept in the test
    log). No traceback may reach stderr."""
    proc = specdiff("diff", train, serve, "--format", "json")
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    text = specdiff("diff", train, serve, "--format", "text").stdout
    print(text)
    return proc, json.loads(proc.stdout), text


def injected(tmp_path: Path, bug: str) -> bool:
    """The plugin said ``bug`` acted in the server's log."""
    return f"specdiff_bug_plugins: {bug} injected" in (tmp_path / "server.log").read_text()
