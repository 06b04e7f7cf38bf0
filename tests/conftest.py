"""Shared fixtures: the CLI, the tiny models, real SGLang CPU servers, synthetic trace pairs and
the Textual pilot helpers. Tests reach specdiff only through its public CLI and public functions;
nothing here edits the import path and no test module imports another.

Here: the environment every test process and the servers it starts share, the collection hooks
(``SHARED_WORKER`` groups for pytest-xdist, the SGLang zygote) and the command-line options; the
fixtures ``run_cli`` (``specdiff ARGS`` in-process), the models ``repo_models`` (``traces/models``),
``bringup_models`` and ``family_models`` (built once, cached in pytest's cache; families other than
DeepSeek-V3 only with ``--family-pairs``: ``make test-families``), ``other_layer_target``,
``scaled_copy``, ``bringup_chain_server`` (an SGLang CPU server several files share, stopped by PID
at session end) and ``server_env``, ``fc_crash``, and the autouse
``early_first_divergence_equals_the_full_one`` (every in-process diff's early first divergence,
replay/diff/compare/early.py, equals the full data's). Registered from tests/support/
(``pytest_plugins``): the hand-built traces of ``aux_traces`` (aux_traces.py), ``tui`` and
``anyio_backend`` (tui.py: the Textual pilot helpers) and ``assert_golden_seed_diff`` (golden.py).
Each fixture says more in its docstring.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: fixture groups kept in their own modules (tests/support/, on the path through pytest's ``pythonpath``)
pytest_plugins = ["support.aux_traces", "support.golden", "support.tui"]


# ---- which tests run by default ------------------------------------------------------------------
# Reports wrap prose at the terminal's width (replay/diff/report.py): one width for every run, a
# terminal, CI's pipe or a pytest-xdist worker (which reports 80 columns), so a text a test looks for
# is wrapped the same way everywhere; the CLI subprocesses tests start inherit it.
os.environ["COLUMNS"] = "120"

# On `make test`'s two pytest-xdist workers a trace writer at its default nice 19 (tracer/writer_process.py)
# starves behind the other worker's server, its trace is cut at the close timeout and a test reading
# every row fails (test_draft_stages and server/test_injected_serving_bugs did): there writers keep the
# server's priority; subprocesses inherit it and server_env keeps it. The default is test_recorder_hot_path's.
WRITER_PRIORITY = {"SPECDIFF_WRITER_NICE": "0"} if os.environ.get("PYTEST_XDIST_WORKER") else {}
os.environ.update(WRITER_PRIORITY)

# SGLang CPU servers in the tests start their scheduler and detokenizer by fork
# (tracer/engines/sglang/cpu/serve.py START_METHOD_ENV): a spawned child imports torch and SGLang
# again, 40-60 s of each of the suite's SGLang starts on 2 busy cores, the largest share of `make test`.
# tests/tracer/engines/test_sglang_recorder.py's ``traced`` server keeps SGLang's own spawn (what a
# user runs) and checks its trace says so; subprocesses (the demo's servers) inherit this.
SERVER_START = {"SPECDIFF_SGLANG_START": "fork"}
os.environ.update(SERVER_START)

# Two workers on two cores: an OpenMP thread that spins while it waits takes the core the other worker's
# server needs (two demo runs side by side: 312 s spinning, 120 s passive). The Makefile sets it for the
# workers themselves; this keeps it for a plain `pytest -n 2` run's servers and subprocesses. Not in a run of
# one process: there nothing competes, and the serial test_recorder_sampling.py times a writer against its server.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_finish(session):
    """Start this worker's SGLang zygote (tracer/engines/sglang/cpu/zygote.py) when a selected test
    may start a CPU server: each server then forks from it instead of importing SGLang again (~25 s
    of the ~38 s a start took). Servers it cannot start as a fresh process would (another Python,
    SGLang's spawn, a sitecustomize, another import-time environment) start as before."""
    from specdiff.tracer.engines.sglang.cpu.forked import ZYGOTE_ENV, start_zygote
    from specdiff.tracer.engines.sglang.cpu.launch import cpu_server_env

    if os.environ.get(ZYGOTE_ENV) or not any(it.get_closest_marker("server") for it in session.items):
        return
    path = os.path.join(tempfile.mkdtemp(prefix="specdiff-zygote-"), "z.sock")  # AF_UNIX: <= 107 bytes
    start_zygote(path, cpu_server_env())
    os.environ[ZYGOTE_ENV] = path


def pytest_addoption(parser):
    parser.addoption("--family-seed", type=int, default=0, metavar="N",
                     help="tests/tracer/engines/test_family_*.py: build each family's random target and "
                          "draft with seeds offset by N (0: the fixed seeds CI uses); `make test-seeds`")
    parser.addoption("--prompt-set", choices=("a", "b"), default="a",
                     help="the family servers' prompts: a (CI's) or b (another set); `make test-seeds`")
    parser.addoption("--family-pairs", action="store_true",
                     help="also run the tests marked family_pair (they build a trained target + draft of a "
                          "family other than DeepSeek-V3: 3-13 min each on 2 cores); `make test-families`")


#: test files that share a pytest-xdist worker in ``make test``: a session-scoped server or build
#: that each worker would otherwise start or build again, or a cache two servers must not write at once
SHARED_WORKER = {
    "server/test_cpu_server.py": "bringup-chain", "tracer/engines/test_sglang_recorder.py": "bringup-chain",
    "demo_models/test_family_models.py": "deepseek-pair", "server/test_family_seed.py": "deepseek-pair",
    "tracer/engines/test_vllm_recorder.py": "vllm", "demo/test_vllm_demo.py": "vllm",  # vLLM's compile cache
    "server/test_multilayer_vllm_server.py": "vllm",
    # one session-scoped server per (family, mode) read by the three (tracer/engines/conftest.py)
    **dict.fromkeys(FAMILY_FILES := ("tracer/engines/test_family_servers.py", "tracer/engines/test_family_contract.py",
                                     "tracer/engines/test_family_correct_pairs.py"), "family-servers"),
}

#: test files whose tests are grouped by the value of one parameter rather than as one file: each
#: value's module-scoped servers are started where its tests run, and the values spread over the workers
SPLIT_BY_PARAM = dict.fromkeys(FAMILY_FILES, "family")


@pytest.hookimpl(tryfirst=True)  # the groups are in place before pytest-xdist reads them
def pytest_collection_modifyitems(config, items):
    """Deselect ``family_pair`` tests unless ``--family-pairs`` is given or ``-m`` names the
    marker: ``make test`` builds only the seed family's (DeepSeek-V3) trained pair.

    ``make test`` runs on two pytest-xdist workers (``--dist loadgroup``): each file is one
    ``xdist_group`` (``SHARED_WORKER``: a few files together), so its module-scoped servers start
    once. On a worker the groups with server or slow tests go first, most such tests first and the
    DeepSeek-V3 pair's build (minutes) before all, so the many quick files fill both workers' ends."""
    if not (config.getoption("--family-pairs") or "family_pair" in (config.getoption("markexpr") or "")):
        drop = [it for it in items if it.get_closest_marker("family_pair") is not None]
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = [it for it in items if it.get_closest_marker("family_pair") is None]
    moved = [f for f in (*SHARED_WORKER, *SPLIT_BY_PARAM) if not (ROOT / "tests" / f).is_file()]
    if moved:  # a renamed file would silently lose its shared server or build
        raise pytest.UsageError(f"tests/conftest.py SHARED_WORKER / SPLIT_BY_PARAM name test files that do not exist: {moved}")
    file = {it: it.path.relative_to(ROOT / "tests").as_posix() for it in items}
    group = {it: SHARED_WORKER.get(file[it], file[it]) for it in items}
    rank: dict[str, list] = {}
    for it in items:  # a test's own xdist_group mark (tests/server/test_scenarios.py) overrides its file's
        own = it.get_closest_marker("xdist_group")
        param = SPLIT_BY_PARAM.get(file[it])
        if own is not None:
            group[it] = own.args[0] if own.args else own.kwargs["name"]
        elif param and param in getattr(getattr(it, "callspec", None), "params", {}):
            # not "file[value]": pytest-xdist 3.8 reads a group only after the last "]" of the node id
            # (scheduler/loadgroup.py _split_scope), so such a name made every test its own unit
            group[it] = f"{group[it]}::{param}={it.callspec.params[param]}"
    bad = sorted({g for g in group.values() if "]" in g})
    if bad:  # pytest-xdist would run each of their tests as its own unit, each starting the servers again
        raise pytest.UsageError(f"tests/conftest.py: xdist group names must not contain ']': {bad}")
    for i, it in enumerate(items):
        if it.get_closest_marker("xdist_group") is None:
            it.add_marker(pytest.mark.xdist_group(group[it]))
        r = rank.setdefault(group[it], [group[it] != "deepseek-pair", 0, i])
        r[1] -= any(it.get_closest_marker(m) for m in ("server", "slow"))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda it: rank[group[it]])


# ---- the CLI ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def run_cli():
    """``run_cli(*args, input=None)`` -> ``click.testing.Result`` of ``specdiff ARGS``.

    Arguments are passed through ``str`` (paths welcome). Exceptions other than the CLI's own exit
    propagate (``catch_exceptions=False``): an unexpected traceback fails the test where it happened.
    ``result.stdout`` / ``result.stderr`` are separate; ``result.output`` interleaves both."""
    from click.testing import CliRunner

    from specdiff.tui.cli import main

    def invoke(*args, input: str | None = None):  # noqa: A002 - click's name
        return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)

    return invoke


# ---- models -------------------------------------------------------------------------------------
def _other_layer_target(src: Path, out: Path, *, layer: int, scale: float, seed: int = 5) -> Path:
    """A copy of the target at ``src`` in ``out`` whose decoder layer ``layer`` has its projections moved
    by ``scale`` times their std (Gaussian, ``seed``): the same config and embedding, other decoder weights."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    sd = load_file(str(out / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for k, v in sd.items():
        if k.startswith(f"model.layers.{layer}.") and k.endswith("proj.weight"):
            sd[k] = (v.float() + scale * v.float().std() * torch.randn(v.shape, generator=g)).to(v.dtype)
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def other_layer_target():
    """``other_layer_target(src, out, layer=, scale=, seed=5)`` -> ``out``: a copy of the target at ``src``
    whose decoder layer ``layer`` has its projections moved by ``scale`` times their std (same config
    and embedding, other decoder weights)."""
    return _other_layer_target


@pytest.fixture(scope="session")
def repo_models() -> Path:
    """``traces/models`` (``target/``, ``draft/``, ``data/``); skips when it is not built."""
    from specdiff.demo.run import REPO_MODELS

    if not (REPO_MODELS / "draft" / "config.json").is_file():
        pytest.skip("the demo models are not built (python -m specdiff.demo_models.tiny_models --out traces/models)")
    return REPO_MODELS


def _build_key(*files: Path) -> str:
    """16 hex digits over the bytes of ``files`` (builder sources, inputs) and the library versions
    a build depends on: a cached build is reused only while all of them are unchanged."""
    h = hashlib.sha256()
    for f in files:
        h.update(Path(f).read_bytes())
    for dist in ("torch", "transformers", "tokenizers", "safetensors"):
        h.update(f"{dist}={version(dist)};".encode())
    return h.hexdigest()[:16]


def _cached_build(request, tmp_path_factory, name: str, key: str, build) -> Path:
    """The folder where ``build(folder)`` wrote its models, built once and then reused.

    With pytest's cache it is ``<cache>/name/key``, kept across sessions; without it (``-p
    no:cacheprovider``) a fresh temporary folder. The build runs in a private folder that is then
    renamed into place, so a folder that exists is complete and two sessions never see half a
    model (the second to finish drops its own copy and uses the first's)."""
    cache = getattr(request.config, "cache", None)
    if cache is None:
        root = tmp_path_factory.mktemp(name)
        build(root)
        return root
    root = Path(cache.mkdir(name)) / key
    if not root.is_dir():
        building = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=root.parent))
        try:
            build(building)
            building.rename(root)
        except OSError:
            if not root.is_dir():
                raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return root


@pytest.fixture(scope="session")
def bringup_models(request, tmp_path_factory) -> SimpleNamespace:
    """The bring-up pairs of ``specdiff.demo_models.bringup``: ``.target``/``.draft`` (random
    weights, draft aux ids [1, 3, 4]) and ``.oracle_target``/``.oracle_draft`` (a draft that is
    always right). Built once; reused from pytest's cache while the builder and libraries are
    unchanged (:func:`_cached_build`)."""
    from specdiff.demo_models import bringup

    def build(folder: Path) -> None:
        bringup.build_bringup_models(folder)
        bringup.build_oracle_models(folder)

    root = _cached_build(request, tmp_path_factory, "specdiff-bringup", _build_key(Path(bringup.__file__)), build)
    target, draft = bringup.build_bringup_models(root)  # both already built: these only name the paths
    oracle_target, oracle_draft = bringup.build_oracle_models(root)
    return SimpleNamespace(root=root, target=target, draft=draft, oracle_target=oracle_target,
                           oracle_draft=oracle_draft)


#: families whose trained pair is committed in the demo's folder for them (``demo.run.family_models_dir``:
#: ``traces/families/F``, built by ``python -m specdiff.demo_models.families --pair-dir traces/families/F F``):
#: ``make test`` uses it as committed (DeepSeek-V3's build is 9-15 min on 2 cores, the suite's longest
#: item); ``--family-pairs`` (``make test-families``) builds it afresh like every other family's
COMMITTED_PAIRS = ("deepseek_v3",)


class FamilyModels:
    """``family_models[family]`` -> ``SimpleNamespace(target, draft, data, manifest)``: the tiny
    trained target of that family (``specdiff.demo_models.families.FAMILIES``) and the EAGLE-3
    draft trained on it: the committed pair of a family in ``COMMITTED_PAIRS`` unless
    ``--family-pairs``, else built on first use of that family only (a few minutes each) and cached
    across sessions (:func:`_cached_build`), keyed by the builder sources, the demo tokenizer
    and the library versions."""

    def __init__(self, request, tmp_path_factory):
        from specdiff.demo_models import families, recipe, tiny_models, train_draft
        from specdiff.replay.model import checkpoint, draft_model, target_capture

        self._request, self._tmp = request, tmp_path_factory
        self.families = families.FAMILIES
        sources = [Path(m.__file__) for m in (families, recipe, tiny_models, train_draft, checkpoint, draft_model,
                                              target_capture)]
        tok = families.demo_tokenizer_dir()
        self._key = _build_key(*sources, *([tok / "tokenizer.json"] if tok else []))
        self._built: dict[str, SimpleNamespace] = {}

    def __getitem__(self, family: str) -> SimpleNamespace:
        import json

        from specdiff.demo_models.families import build_family_pair

        if family not in self.families:
            raise KeyError(f"unknown family {family!r}; known: {self.families}")
        if family not in self._built:
            from specdiff.demo.run import family_models_dir

            committed = family_models_dir(family)
            if (family in COMMITTED_PAIRS and not self._request.config.getoption("--family-pairs")
                    and (committed / "manifest.json").is_file()):
                root = committed
            else:
                root = _cached_build(self._request, self._tmp, "specdiff-families",
                                     f"{self._key}-{family}",
                                     lambda d: build_family_pair(family, d, log=lambda m: None))
            self._built[family] = SimpleNamespace(
                family=family, root=root, target=root / "target", draft=root / "draft", data=root / "data",
                manifest=json.loads((root / "manifest.json").read_text()))
        return self._built[family]


@pytest.fixture(scope="session")
def family_models(request, tmp_path_factory) -> FamilyModels:
    """:class:`FamilyModels`: ``family_models["deepseek_v3"].target`` / ``.draft`` (lazy per family)."""
    return FamilyModels(request, tmp_path_factory)


# ---- real SGLang servers on the CPU ---------------------------------------------------------------
def _server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDIFF_")}
    env.update({**WRITER_PRIORITY, **SERVER_START, **extra})
    return env


@pytest.fixture(scope="session")
def server_env():
    """``server_env(**extra)`` -> this process's environment without any ``SPECDIFF_*`` variable
    (a server must trace only where a test asks it to) but ``WRITER_PRIORITY``'s and ``SERVER_START``'s,
    plus ``extra``."""
    return _server_env


class SharedServer:
    """A running :class:`~specdiff.tracer.engines.sglang.cpu.launch.ServerProcess` that several test files use.

    ``fresh()`` returns it with an empty radix cache (SGLang's ``/flush_cache``): a prefix cached
    by an earlier user would change the prefill's shapes, and so bf16 results past a near tie."""

    def __init__(self, server):
        self.server = server

    def fresh(self):
        import requests

        deadline = time.monotonic() + 60
        while True:  # SGLang refuses to flush while a request is still running
            r = requests.post(self.server.url + "/flush_cache", timeout=30)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200, f"/flush_cache answered {r.status_code}: {r.text}"
        return self.server


@pytest.fixture(scope="session")
def bringup_chain_server(bringup_models):
    """:class:`SharedServer`: untraced SGLang, bring-up target + draft, EAGLE-3 chain (3 steps,
    topk 1, 4 draft tokens), bfloat16. server/test_cpu_server.py (speculative vs plain greedy) and
    test_sglang_recorder.py (traced vs untraced tokens) both serve this configuration, so it
    starts once per session. Idle, it sleeps (``--sleep-on-idle``) instead of polling a core.
    Stopped by PID at session end, also when a test failed; the teardown checks it is gone."""
    pytest.importorskip("sglang")
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    srv = ServerProcess(bringup_models.target, draft_model_path=bringup_models.draft,
                        spec=SpecSettings(num_steps=3, topk=1, num_draft_tokens=4),
                        extra_args=["--dtype", "bfloat16", "--sleep-on-idle"], env=_server_env())
    srv.start()
    try:
        yield SharedServer(srv)
    finally:
        pid = srv.pid
        srv.stop()
        assert srv.proc.poll() is not None, f"server {pid} still running after stop()"


# ---- an engine's crash, raised for real --------------------------------------------------------
def _fc_crash() -> RuntimeError:
    try:
        import torch

        torch.nn.Linear(768, 256, bias=False)(torch.zeros(7, 512))
    except RuntimeError as exc:
        return exc
    raise AssertionError("an fc of the wrong width did not raise")


@pytest.fixture(scope="session")
def fc_crash():
    """``fc_crash()`` -> a new RuntimeError as SGLang's EAGLE-3 draft raises it when 2 aux slots
    were captured for an fc built for 3 (llama_eagle3.py ``self.fc``: a [7, 512] input against a
    [256, 768] weight, CPU), raised in torch's Linear.forward so its frames carry the shapes."""
    return _fc_crash


# ---- a check on every in-process diff --------------------------------------------------------
@pytest.fixture(autouse=True)
def early_first_divergence_equals_the_full_one(monkeypatch):
    """Every ``compare_all`` a test runs (through ``diff_traces`` / ``diff_opened``, the app
    included) must say its early first divergence (replay/diff/compare/early.py) exactly once when, and
    only when, the full data has one, and it must be the full data's ``first_divergence``: the
    same tensor, finding kind and aligned (pair, pos, depth). Every scenario pair of the tests
    thus checks the early rule."""
    from specdiff.replay.diff import pipeline
    from specdiff.replay.diff.compare import compare

    original = compare.compare_all

    def checked(*args, on_first=None, **kwargs):
        said = []

        def record(early):
            said.append(early)
            if on_first is not None:
                on_first(early)

        comps = original(*args, on_first=record, **kwargs)
        full = compare.first_divergence(comps)
        if full is None:
            assert said == [], f"an early first divergence {said} where the full data has none"
        else:
            where = ({k: full.worst[k] for k in ("pair", "pos", "depth")} if full.kind == "tokens"
                     else full.first_where)
            assert len(said) == 1, f"early first divergence said {len(said)} times"
            got = said[0]
            assert (got.name, got.kind, got.where) == (full.name, full.kind, where), \
                f"early {got} != full {(full.name, full.kind, where)}"
        return comps

    monkeypatch.setattr(pipeline, "compare_all", checked)


@pytest.fixture(scope="session")
def scaled_copy():
    """``copy(src, dst, key, factor) -> dst``: a copy of checkpoint directory ``src`` at ``dst``
    with safetensors weight ``key`` multiplied by ``factor`` (a fine-tuned or mis-built model)."""
    from safetensors.torch import load_file, save_file

    def copy(src, dst, key: str, factor: float):
        shutil.copytree(src, dst)
        f = next(Path(dst).glob("*.safetensors"))
        w = load_file(str(f))
        w[key] = w[key] * factor
        save_file(w, str(f), metadata={"format": "pt"})
        return dst

    return copy
