"""Real SGLang 0.5.23 serving EAGLE-3 on this CPU, through specdiff's launcher.

Starts real servers (``specdiff.tracer.engines.sglang.cpu.launch.ServerProcess``: stand-in ``sgl_kernel``
first on PYTHONPATH, AMX platform override in the launching process) on throwaway tiny
models built offline (``specdiff.demo_models.bringup``, the ``bringup_models`` fixture). Each
server takes ~30-60 s to start; the bfloat16 chain is the session's shared
``bringup_chain_server`` (tests/conftest.py). Run with ``pytest -m server``.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from specdiff.tracer.engines.sglang.cpu.launch import ServerError, ServerProcess, SpecSettings  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(1200)]

PROMPTS = ["def main():\n    ", "import os\nimport sys\n\nclass "]
MAX_NEW = 24


CHAIN = SpecSettings(num_steps=3, topk=1, num_draft_tokens=4)


@pytest.fixture(scope="module")
def model_root(bringup_models) -> Path:
    return bringup_models.root


def _generate_all(srv: ServerProcess, prompt_ids: list[list[int]], **request) -> list[dict]:
    return [srv.generate(input_ids=ids, max_new_tokens=MAX_NEW, request=request or None) for ids in prompt_ids]


@pytest.fixture(scope="module")
def prompt_ids(model_root) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_root / "target")
    return [tok(p)["input_ids"] for p in PROMPTS]


def _plain_top2_logits(model_dir: Path, prompt: list[int], out: dict) -> list[tuple[float, float]]:
    """The plain run's top-2 logits at each output position: SGLang's own margin (its top-2
    logprobs differ by exactly the logit margin) placed at the magnitude of the top logit, which
    logprobs cannot give and which the same weights give in transformers (float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    margins = [t[0][0] - t[1][0] for t in out["meta_info"]["output_top_logprobs"]]
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids = torch.tensor([prompt + out["output_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1]
    top1 = logits.max(dim=-1).values.tolist()
    return [(a, a - m) for a, m in zip(top1, margins, strict=True)]


@pytest.fixture(scope="module")
def plain_runs(model_root, prompt_ids):
    """dtype -> (plain greedy outputs with top-2 logprobs, their top-2 logits) of a
    non-speculative server; one server per dtype for the whole module."""
    cache = {}

    def run(dtype: str):
        if dtype not in cache:
            with ServerProcess(model_root / "target", extra_args=["--dtype", dtype]) as srv:
                outs = _generate_all(srv, prompt_ids, return_logprob=True, top_logprobs_num=2)
            for o in outs:
                assert "spec_accept_length" not in o["meta_info"]
            top2 = [_plain_top2_logits(model_root / "target", p, o) for p, o in zip(prompt_ids, outs, strict=True)]
            cache[dtype] = (outs, top2)
        return cache[dtype]

    return run


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def plain_run(request, plain_runs):
    """(dtype, plain greedy output ids, their top-2 logits)."""
    outs, top2 = plain_runs(request.param)
    return request.param, [o["output_ids"] for o in outs], top2


@pytest.mark.parametrize(
    "spec",
    [CHAIN, SpecSettings(num_steps=3, topk=2, num_draft_tokens=4)],
    ids=["chain", "topk2-tree"],
)
def test_greedy_eagle3_output_equals_non_speculative_output_up_to_the_first_near_tie(model_root, prompt_ids,
                                                                                      plain_run, spec, request):
    """Speculative and plain greedy decoding run different kernel paths (a verify forward over
    the draft tree vs a 1-token decode), so they agree by design only until the plain run's
    top-2 logit margin is within the dtype's resolution (``replay.tolerance.first_near_tie``);
    past a near tie, which token wins depends on the CPU's matmul kernels."""
    from specdiff.replay.diff.measure.tolerance import first_near_tie

    dtype, plain_outputs, plain_top2 = plain_run
    with _speculating(request, model_root, spec, dtype) as srv:
        outs = _generate_all(srv, prompt_ids)
    compared = 0
    for o, plain, top2 in zip(outs, plain_outputs, plain_top2, strict=True):
        meta = o["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW
        assert meta["spec_verify_ct"] > 0 and meta["spec_accept_length"] >= 1.0
        tie = first_near_tie(top2, dtype=dtype)
        n = MAX_NEW if tie is None else tie  # at and after a near tie either token may win
        assert o["output_ids"][:n] == plain[:n], f"spec and plain part before the first near tie (position {tie})"
        compared += n
    if dtype == "float32":
        # float32 resolves every margin this tiny model produces: the whole output is compared.
        assert compared == MAX_NEW * len(PROMPTS)


@contextmanager
def _speculating(request, model_root: Path, spec: SpecSettings, dtype: str):
    """A server speculating with ``spec`` in ``dtype`` on the bring-up pair: the session's shared
    one for the bf16 chain (stopped at session end), else one of its own, stopped by PID here."""
    if (spec, dtype) == (CHAIN, "bfloat16"):
        yield request.getfixturevalue("bringup_chain_server").fresh()
        return
    with ServerProcess(model_root / "target", draft_model_path=model_root / "draft", spec=spec,
                       extra_args=["--dtype", dtype]) as srv:
        pid = srv.pid
        yield srv
    assert srv.proc.poll() is not None, f"server {pid} still running after stop()"


def test_near_tie_rule_on_constructed_logits():
    from specdiff.replay.diff.measure.tolerance import NEAR_TIE_ULPS, first_near_tie, is_near_tie, logit_ulp

    # bf16 keeps 8 significant bits: logits in [2, 4) are spaced 2**-6 apart, in [8, 16) 2**-4.
    assert logit_ulp(3.0, dtype="bfloat16") == 2.0 ** -6
    assert logit_ulp(-9.5, dtype="bfloat16") == 2.0 ** -4
    assert logit_ulp(3.0, dtype="float32") == 2.0 ** -22
    one_ulp = 2.0 ** -6
    assert is_near_tie(3.0, 3.0, dtype="bfloat16")                          # exact tie
    assert is_near_tie(3.0, 3.0 - one_ulp, dtype="bfloat16")                # the flip seen on AMX CPUs
    assert is_near_tie(3.0, 3.0 - NEAR_TIE_ULPS * one_ulp, dtype="bfloat16")
    assert not is_near_tie(3.0, 3.0 - (NEAR_TIE_ULPS + 1) * one_ulp, dtype="bfloat16")
    assert not is_near_tie(3.0, 3.0 - one_ulp, dtype="float32")            # float32 resolves it
    # The same margin is a tie at a larger magnitude (coarser spacing).
    assert not is_near_tie(3.0, 2.9, dtype="bfloat16") and is_near_tie(12.0, 11.9, dtype="bfloat16")
    assert first_near_tie([(5.0, 3.0), (3.0, 2.0), (4.0, 4.0), (3.0, 3.0)], dtype="bfloat16") == 2
    assert first_near_tie([(5.0, 3.0)], dtype="bfloat16") is None


def test_an_always_right_draft_is_fully_accepted(model_root):
    spec = SpecSettings(num_steps=3, topk=1, num_draft_tokens=4)
    with ServerProcess(model_root / "oracle-target", draft_model_path=model_root / "oracle-draft", spec=spec) as srv:
        out = srv.generate(PROMPTS[0], max_new_tokens=MAX_NEW)
    meta = out["meta_info"]
    assert out["output_ids"] == [0] * MAX_NEW
    # every verify commits 3 drafts + 1 bonus
    assert meta["spec_verify_ct"] == MAX_NEW // 4
    assert meta["spec_accept_length"] == pytest.approx(4.0)
    assert meta["spec_num_correct_drafts"] == meta["spec_num_proposed_drafts"]


def test_a_server_that_dies_at_startup_reports_its_log(tmp_path):
    srv = ServerProcess(tmp_path / "no-such-model", startup_timeout_s=300, log_path=tmp_path / "server.log")
    with pytest.raises(ServerError, match="exited with code") as err:
        srv.start()
    assert "last lines" in str(err.value)
    assert srv.proc.poll() is not None


def test_standin_attention_matches_sglang_torch_native_backend_in_fp32(model_root, prompt_ids, plain_runs):
    """Independent check of the attention stand-ins inside SGLang: the same model served
    with SGLang's own torch_native attention. Two attention kernels agree up to the first near
    tie (``replay.tolerance.first_near_tie``); in float32 this tiny model has none, so every
    token is compared (in bf16 a random model's near-tied logits flip between implementations)."""
    from specdiff.replay.diff.measure.tolerance import first_near_tie

    standin, top2 = plain_runs("float32")  # the stand-ins are the CPU server's default backend
    with ServerProcess(model_root / "target",
                       extra_args=["--dtype", "float32", "--attention-backend", "torch_native"]) as srv:
        native = _generate_all(srv, prompt_ids)
    for a, b, t in zip(standin, native, top2, strict=True):
        tie = first_near_tie(t, dtype="float32")
        assert tie is None, f"a float32 near tie at {tie}: this check needs a model without one"
        assert a["output_ids"] == b["output_ids"]


def test_a_cuda_server_runs_sglangs_own_launcher_without_the_cpu_recipe(tmp_path):
    # benchmarks/recorder_overhead.py --device cuda: the recorder's cost measured on SGLang as served
    srv = ServerProcess(tmp_path / "t", draft_model_path=tmp_path / "d", spec=SpecSettings(num_steps=5),
                        device="cuda", extra_args=["--tp-size", "2"], env={"SPECDIFF_TRACE": "x"}, port=1234)
    argv, env = srv.command()
    assert argv[1:3] == ["-m", "sglang.launch_server"] and argv[argv.index("--device") + 1] == "cuda"
    assert "--disable-cuda-graph" not in argv and "--attention-backend" not in argv
    assert argv[argv.index("--speculative-num-steps") + 1] == "5" and argv[-2:] == ["--tp-size", "2"]
    assert env == {"SPECDIFF_TRACE": "x"}  # no CPU stand-ins on PYTHONPATH
    with pytest.raises(ServerError, match="'tpu'"):
        ServerProcess(tmp_path / "t", device="tpu", port=1).command()


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
def test_record_client_sends_each_stored_token_sequence_in_the_trainers_order(request, run_cli, tmp_path, fmt):
    # the session's shared chain server answers the stored sequences as prompts; each request's reply says how
    # many prompt tokens it took, so the stored ids are what was sent, in the trainer's file order
    import numpy as np
    import requests
    import torch
    from builders import write_stored_features

    srv = request.getfixturevalue("bringup_chain_server").fresh()
    rng = np.random.default_rng(3)
    tokens = [rng.integers(1, 200, size=n) for n in (9, 14, 6)]
    hidden = [torch.zeros(len(t), 3, 8) for t in tokens]
    out = write_stored_features(tmp_path / fmt, fmt, tokens, hidden, [h[:, 0] for h in hidden])
    seen = []
    post = requests.post

    def recording(url, *a, **kw):  # the request as it leaves the client, then the real answer
        if url.endswith("/generate"):
            seen.append(list((kw.get("json") or {}).get("input_ids") or []))
        return post(url, *a, **kw)

    request.getfixturevalue("monkeypatch").setattr(requests, "post", recording)
    res = run_cli("record", "client", "--url", srv.url, "--prompts-from-features", out, "--max-new-tokens", "4")
    assert res.exit_code == 0, res.output
    assert seen == [t.tolist() for t in tokens]
    lines = [ln for ln in res.stdout.splitlines() if ln.lstrip()[:1].isdigit()]
    assert len(lines) == 3 and all(" tokens 4 " in ln for ln in lines), res.stdout
    assert "mean accept length " in res.stdout
