"""Each target family EAGLE-3 is served on, on real CPU SGLang servers, ONE server per (family, mode),
shared by the family tests of ``tests/tracer/engines/`` (serving, the live contract, correct pairs).

Real SGLang 0.5.23 servers on this CPU (``specdiff.tracer.engines.sglang.cpu.launch``) on tiny
seeded targets of each family (``specdiff.demo_models.families.build_family_target``, random
weights, 8 layers, hidden 256, vocab 4096: Qwen3 with q/k norms; Qwen3-MoE with 4 experts top-2;
DeepSeek-V3 with MLA, yarn rope, grouped top-k routing and a shared expert; GPT-OSS with
alternating sliding/full attention, attention sinks and 4 experts) and a random EAGLE-3 draft
(``demo_models.bringup.build_draft``) whose aux ids are chosen so that each family's own rule
matters (``CASES``).

Each family is served as an EAGLE-3 chain (3 steps, topk 1, 4 draft tokens) and a top-2 tree (3
steps, topk 2, 6 draft tokens), both traced (``SPECDIFF_TRACE``), and DeepSeek-V3 and GPT-OSS also
without speculation (``PLAIN_FAMILIES``: the reference for speculative greedy). ``serve_families``
starts each (family, mode) server once per session (the fixture ``family_servers`` in
tests/tracer/engines/conftest.py), sends every request all checks need (the same prompts for every
mode), stops it by PID and checks it is gone before the next one starts: at most one server is alive
at any time, 10 starts in all. ``make test`` runs one family's tests on one worker
(tests/conftest.py ``SPLIT_BY_PARAM``), so each server starts once however the tests are filed.

Random drafts are rarely right (accept length near 1): the tests check each family's kernels,
capture and replay, not draft quality. Run with ``pytest -m server tests/tracer/engines/test_family_*.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from specdiff.tracer.engines.sglang.cpu.launch import SpecSettings

__all__ = ["CASES", "FAMILIES", "FLOAT32_CHECKED", "FLOAT32_TOKENS", "MAX_NEW", "MODES", "MOE_FAMILIES",
           "PLAIN_FAMILIES", "PROMPT_SETS", "SPEC_MODES", "Case", "cli", "correct_pairs", "serve_families"]


@dataclass(frozen=True)
class Case:
    ids: list[int]              # the draft's eagle_aux_hidden_state_layer_ids
    hf: list[int]               # what SGLang 0.5.23 captures from them (read off the model file)
    architecture: str
    rule_file: str              # the file whose set_eagle3_layers_to_capture runs
    experts: int | None         # routed experts / experts per token of the tiny target
    per_token: int | None


CASES = {
    "qwen3": Case([1, 3, 4], [2, 4, 5], "Qwen3ForCausalLM", "srt/models/qwen3.py", None, None),
    "qwen3_moe": Case([1, 3, 4], [2, 4, 5], "Qwen3MoeForCausalLM", "srt/models/qwen3_moe.py", 4, 2),
    # max(ids) == L: kept literally; index 8 is the last layer's output before the final norm, which HF
    # hidden_states[8] (after the norm) is not: the contract lists it in aux_prenorm_indices, and
    # record train replays it from the final norm's input
    "gpt_oss": Case([0, 3, 8], [0, 3, 8], "GptOssForCausalLM", "srt/models/gpt_oss.py", 4, 2),
    # the motivating family: ids[0] != 1, so the ids are captured literally (not id + 1)
    "deepseek_v3": Case([0, 3, 6], [0, 3, 6], "DeepseekV3ForCausalLM", "srt/models/deepseek_v2.py", 4, 2),
}
FAMILIES = tuple(CASES)
MOE_FAMILIES = ("qwen3_moe", "gpt_oss", "deepseek_v3")
MODES = {
    "plain": None,
    "chain": SpecSettings(num_steps=3, topk=1, num_draft_tokens=4),
    "tree": SpecSettings(num_steps=3, topk=2, num_draft_tokens=6),
}
SPEC_MODES = ("chain", "tree")
#: families served without speculation too (the reference for speculative greedy): DeepSeek-V3,
#: whose serving is new in the CPU recipe, and GPT-OSS, which has no float32 check (below)
PLAIN_FAMILIES = ("deepseek_v3", "gpt_oss")
#: families whose served tokens are checked against transformers' float32 greedy. Not GPT-OSS:
#: its bf16 served tokens leave the bf16 near-tie band of that greedy at ~7 of 48 positions (up to
#: 11x transformers' own bf16-vs-fp32 logit noise at the position) and SGLang 0.5.23 cannot serve it
#: in float32 to settle whether router near ties or an engine difference cause it (gpt_oss.py keeps
#: bf16 weights: "mat1 and mat2 must have the same dtype" in the first qkv_proj)
FLOAT32_CHECKED = ("qwen3", "qwen3_moe", "deepseek_v3")
MAX_NEW = 48
#: the float32 check reads the first 16 served tokens of each prompt (as before the servers were
#: shared): on the random-init DeepSeek-V3 target later positions leave the bf16 near-tie band of
#: transformers' float32 greedy (measured at 48 tokens: position 20-30, logit gap 0.05-0.08 at
#: logits ~1, router near ties of random weights)
FLOAT32_TOKENS = 16
#: the second prompt extends the first, so its prefill runs over a cached prefix (radix cache):
#: on DeepSeek-V3 the first takes the MHA prefill (no prefix), the second the absorbed MLA path
#: (srt/models/deepseek_common/attention_backend_handler.py handle_attention_triton)
PROMPTS = ["def main(argv):\n    ", "def main(argv):\n    args = parse(argv)\n    for name in args:",
           "class Stack:\n    def push(self, item):\n        self.items.append(item)\n"]
#: ``--prompt-set b`` (``make test-seeds``): other prompts, the second again extending the first
PROMPT_SETS = {"a": PROMPTS, "b": [
    "import os\n\ndef walk(root):\n", "import os\n\ndef walk(root):\n    for path, dirs, files in os.walk(root):\n",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;\n-- ", "x = [i * i for i in range(10)]\nprint("]}


def _wait_contract(path: Path, timeout_s: float = 60.0) -> dict:
    """The trace's contract once start-up facts are in (refresh after _capture_cuda_graphs is
    written by the recorder's writer thread, shortly after the server reports ready)."""
    from specdiff.tracer.store import open_trace

    deadline = time.monotonic() + timeout_s
    while True:
        c = open_trace(str(path)).contract
        if c.get("aux_hf_indices") != "unknown" or time.monotonic() > deadline:
            return c
        time.sleep(0.2)


def cli(*args, timeout: int = 900) -> subprocess.CompletedProcess:
    """``specdiff ARGS`` as a user runs it (a subprocess)."""
    return subprocess.run([sys.executable, "-m", "specdiff.tui", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def serve_families(tmp_path_factory, server_env, config):
    """``run(family, mode)`` -> SimpleNamespace(family, mode, case, target, draft, prompt_ids, outputs,
    trace, contract, root): the (family, mode) server is started on first use only, serves the prompts
    (``MAX_NEW`` greedy tokens each; plain with top-2 logprobs), and is stopped by PID before this
    returns, so at most one server is alive at any time. Spec modes are traced; ``contract`` is the
    trace's contract read after start-up, before the first request. ``--family-seed N`` offsets the
    target's and the draft's seeds, ``--prompt-set`` picks the prompts (``config``: pytest's)."""
    from transformers import AutoTokenizer

    from specdiff.demo_models.bringup import build_draft
    from specdiff.demo_models.families import SEEDS, build_family_target
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess

    pairs: dict[str, SimpleNamespace] = {}
    runs: dict[tuple[str, str], SimpleNamespace] = {}

    def pair(family: str) -> SimpleNamespace:
        if family not in pairs:
            root = tmp_path_factory.mktemp(family)
            offset = config.getoption("--family-seed")
            target = Path(build_family_target(family, root / "target", trained=False,
                                              seed=SEEDS[family] + offset if offset else None))
            build_draft(root / "draft", seed=1 + offset, aux_layer_ids=CASES[family].ids)
            tok = AutoTokenizer.from_pretrained(target)
            prompts = PROMPT_SETS[config.getoption("--prompt-set")]
            pairs[family] = SimpleNamespace(root=root, target=target, draft=root / "draft",
                                            prompt_ids=[tok(p)["input_ids"] for p in prompts])
        return pairs[family]

    def run(family: str, mode: str) -> SimpleNamespace:
        if (family, mode) in runs:
            return runs[family, mode]
        p, spec = pair(family), MODES[mode]
        trace = None if spec is None else p.root / f"{mode}.serve.trace"
        env = server_env() if trace is None else server_env(SPECDIFF_TRACE=str(trace))
        srv = ServerProcess(p.target, draft_model_path=None if spec is None else p.draft, spec=spec,
                            extra_args=["--dtype", "bfloat16"], env=env, log_path=p.root / f"{mode}.log")
        request = {"return_logprob": True, "top_logprobs_num": 2} if spec is None else None
        srv.start()
        try:
            contract = None if trace is None else _wait_contract(trace)  # before any request
            outputs = [srv.generate(input_ids=ids, max_new_tokens=MAX_NEW, request=request) for ids in p.prompt_ids]
        finally:
            pid = srv.pid
            srv.stop()
        assert srv.proc.poll() is not None, f"server {pid} still running after stop()"
        runs[family, mode] = SimpleNamespace(family=family, mode=mode, case=CASES[family], target=p.target,
                                             draft=p.draft, prompt_ids=p.prompt_ids, outputs=outputs,
                                             trace=trace, contract=contract, root=p.root)
        return runs[family, mode]

    return run


def correct_pairs(run):
    """``pair(family, mode)`` -> (``specdiff diff`` process, its JSON report, train trace) for the served
    trace of (family, mode) (``run``: ``serve_families``'s) against ``specdiff record train --replay`` of
    it with the same target and draft; each pair is recorded and diffed once."""
    made: dict[tuple[str, str], tuple[subprocess.CompletedProcess, dict, Path]] = {}

    def pair(family: str, mode: str):
        if (family, mode) not in made:
            served = run(family, mode)
            train = served.root / f"{mode}.train.trace"
            rec = cli("record", "train", "--target", served.target, "--draft", served.draft, "--replay", served.trace,
                      "-o", train, "--overwrite")
            assert rec.returncode == 0, f"record train failed:\n{rec.stdout[-3000:]}\n{rec.stderr[-3000:]}"
            diff = cli("diff", train, served.trace, "--format", "json")
            assert diff.stdout.strip(), f"diff printed no report:\n{diff.stderr[-3000:]}"
            made[family, mode] = (diff, json.loads(diff.stdout), train)
        return made[family, mode]

    return pair
