"""Built-in demo scenarios: a correctly trained draft, served with one real-world contract mistake.

Each scenario writes the *served* copy of the demo draft (what the user shipped to SGLang);
the training side always replays with the draft as it was trained. The demo draft was trained
on HF hidden_states [0, 3, 6] (embedding output, outputs of layers 2 and 5). Which SGLang ids
capture those depends on the target's model file (``eagle3.families.sglang_family_rule``): on
the Llama demo target id k captures HF k+1 (-1 = embeddings), ids [-1, 2, 5]; on a DeepSeek-V3 /
Kimi-K2 target (deepseek_v2.py:3458) the ids are HF indices, [0, 3, 6]. ``scenario_ids`` gives
each scenario's ids from the target's own rule, so every scenario means the same mistake on
every family.

A scenario with ``trained_order`` stands for a draft trained on the same layers concatenated in
another order: its fc.weight column blocks are reordered to match (``reorder_fc_blocks``), so
the training side, fed in that order (``record train --aux-layers``), computes exactly what the
demo draft computes; that reordered checkpoint is both what was trained and what is served.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from specdiff.eagle3.aux_layers import native_aux_ids
from specdiff.eagle3.config_keys import KEY_NESTED, set_config_value
from specdiff.eagle3.engines import SGLANG, engine_spec
from specdiff.eagle3.fc_blocks import reorder_fc_blocks

#: the demo's target families -> HF architecture of each tiny target (``config.json`` ``architectures[0]``);
#: ``specdiff.demo_models.families`` builds them, the demo (``--family``) checks a built target against it
DEMO_FAMILIES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}

# The demo's one definition of its layers (demo_models.train_draft trains on them).
TRAINED_HF = [0, 3, 6]  # HF hidden_states the demo draft was trained on: embedding, out L2, out L5
#: what the seed's server captured instead: the training layers shifted by one slot ([embedding, L3,
#: L31] trained, [L3, L31, L59] served on Kimi-K2; here [emb, L3, L6] trained, [L3, L6, L7] served)
SEED_SERVED_HF = [3, 6, 7]
#: the engine the demo was built on and serves by default: its scenarios are ``SCENARIOS`` and its workdirs
#: carry no engine prefix; another engine's scenarios are in ``ENGINE_SCENARIOS``
DEMO_ENGINE = SGLANG.name
CORRECT_SGLANG_IDS = native_aux_ids(TRAINED_HF, "sglang")  # [-1, 2, 5] on the Llama demo target
SEED_WRONG_IDS = native_aux_ids(SEED_SERVED_HF, "sglang")  # [2, 5, 6] on the Llama demo target


@dataclass(frozen=True)
class ScenarioIds:
    """The ids of every scenario on one target and serving engine, in that engine's numbering
    (SGLang: the target architecture's rule; vLLM: id k = HF k) and config key.

    Attributes:
        architecture: the target's HF ``architectures[0]`` (None: the Llama rule).
        correct: ids that capture ``TRAINED_HF``.
        seed: ids that capture ``SEED_SERVED_HF`` (the seed's shifted layers).
        literal: the off-by-one mistake: the trained layers written in the *other* engine's
            numbering (SGLang: ``TRAINED_HF`` as HF / vLLM ids; vLLM: SGLang's ids, as an
            SGLang-format draft ships them); ``literal_hf``: what the engine captures from them.
        rule: the rule in words with its source.
        engine: the serving engine ('sglang', 'vllm'; ``eagle3.engines.engine_spec``).
        key: the draft-config key the engine reads first (``EngineSpec.aux_ids_key``): correct,
            seed and reordered ids go there.
        literal_key: the key the off-by-one ids are written in (SGLang's nested key for both:
            where a user writes ids for SGLang, and where an SGLang-format draft carries them).
    """

    architecture: str | None
    correct: list[int]
    seed: list[int]
    literal: list[int]
    literal_hf: list[int]
    rule: str
    engine: str = DEMO_ENGINE
    key: str = KEY_NESTED
    literal_key: str = KEY_NESTED

    def ids_for(self, hf_order) -> list[int]:
        """Ids that capture HF ``hf_order`` (listed order kept) on this target and engine."""
        spec = engine_spec(self.engine)
        return native_aux_ids(hf_order, spec.aux_convention,
                              architecture=self.architecture if spec.aux_family_rules else None)


def scenario_ids(architecture: str | None = None, num_layers: int = 8, engine: str = DEMO_ENGINE) -> ScenarioIds:
    """:class:`ScenarioIds` for a target of ``architecture`` with ``num_layers`` layers served by
    ``engine`` (None: the Llama demo target; an architecture SGLang's table lacks gets the plus-one
    rule, as ``sglang_family_rule`` says). vLLM numbers every SupportsEagle3 target alike: id k =
    HF k (``RULES['vllm']``, vLLM 0.32.0 model_executor/models/llama.py:427-441).

    Raises:
        ConventionError: the rule has no ids for ``TRAINED_HF`` or ``SEED_SERVED_HF`` on this target.
        UnknownEngineError: an engine no recorder is registered for.
    """
    from specdiff.eagle3.aux_layers import RULES, engine_capture
    from specdiff.eagle3.families import sglang_family_rule

    spec = engine_spec(engine)

    def sglang_ids(hf):
        return native_aux_ids(hf, "sglang", num_layers=num_layers, architecture=architecture)

    if spec.aux_family_rules:
        literal = list(TRAINED_HF)
        rule = sglang_family_rule(architecture or "LlamaForCausalLM")
        return ScenarioIds(architecture, sglang_ids(TRAINED_HF), sglang_ids(SEED_SERVED_HF), literal,
                           list(engine_capture("sglang", literal, num_layers=num_layers,
                                               architecture=architecture).hf_indices),
                           f"{rule.id_meaning()} ({rule.sources[0].split(' ')[0]})", engine, spec.aux_ids_key)

    def ids(hf):
        return native_aux_ids(hf, spec.aux_convention, num_layers=num_layers)

    literal = sglang_ids(TRAINED_HF)
    rule = RULES[spec.aux_convention]
    return ScenarioIds(architecture, ids(TRAINED_HF), ids(SEED_SERVED_HF), literal,
                       list(engine_capture(engine, literal, num_layers=num_layers).hf_indices),
                       f"{spec.aux_id_words} ({rule.sources[0].split(' ')[0]})", engine, spec.aux_ids_key)


@dataclass(frozen=True)
class Scenario:
    """A demo case: its name, what goes wrong, and what the diff should find.

    Attributes:
        expected_first: the tensors any of which may be the first divergence (the stage where
            the mistake first shows), or None when the traces should agree.
        expected_cause: the explanation the diff should rank first, or None when any will do.
    """

    name: str
    summary: str
    expected_first: tuple[str, ...] | None
    expected_cause: str | None
    trained_order: tuple[int, ...] | None = None  # HF concat order of training, when not TRAINED_HF
    expected_crash: bool = False  # the served engine dies at the first request; the diff must say so

    def training_args(self) -> list[str]:
        """``record train`` options that state how this scenario's draft was trained."""
        if self.trained_order is None:
            return []
        return ["--aux-layers", ",".join(map(str, self.trained_order)), "--aux-convention", "hf"]

    def check(self, report) -> tuple[bool, str]:
        """Whether ``report`` (a ``replay.diff.result.DiffReport``) found what this scenario seeded,
        and one line saying so."""
        first = report.first.name if report.first is not None else None
        causes = [e.cause for e in report.explanations]
        if self.expected_crash:
            if report.crash is None:
                return False, (f"demo FAILED: scenario '{self.name}' should crash the server at the first request, "
                               f"but no crash was recorded (first divergence: {first or 'none'})")
            forward = report.crash.get("forward", "a forward")
            cause = report.crash.get("cause")
            if not cause:
                return False, (f"demo FAILED: scenario '{self.name}' crashed the server in {forward} as seeded, but "
                               "nothing explains the crash")
            return True, (f"demo worked: scenario '{self.name}' seeded a mistake that crashes the server; specdiff "
                          f"recorded the crash in {forward} and explains it: {cause.get('message', cause)}")
        if self.expected_first is None:
            if first is None:
                return True, f"demo worked: scenario '{self.name}' served as trained and no divergence was found"
            return False, f"demo FAILED: scenario '{self.name}' should agree, but the diff found {first}"
        want = " or ".join(self.expected_first)
        if first not in self.expected_first:
            return False, f"demo FAILED: scenario '{self.name}' should diverge first at {want}, found {first or 'no divergence'}"
        if self.expected_cause is not None and causes[:1] != [self.expected_cause]:
            return False, (f"demo FAILED: scenario '{self.name}' diverged at {first} as expected, but the "
                           f"explanation is {causes[0] if causes else 'missing'}, not {self.expected_cause}")
        cause = f", explained as {causes[0]}" if causes else ""
        return True, f"demo worked: scenario '{self.name}' seeded a mistake and specdiff found it at {first}{cause}"


SCENARIOS = {
    "seed": Scenario("seed", "served with eagle_aux_hidden_state_layer_ids {seed} (captures HF [3, 6, 7]) "
                     "while training used [embedding output, layer 2, layer 5] = HF [0, 3, 6]",
                     ("target.aux.0",), "aux_layer_shift"),
    "correct": Scenario("correct", "served with eagle_aux_hidden_state_layer_ids {correct} = HF [0, 3, 6], "
                        "as trained", None, None),
    "off-by-one": Scenario("off-by-one", "served with ids {literal} written as HF / vLLM indices; SGLang reads "
                           "id k as HF k+1 and captures HF {literal_hf}", ("target.aux.0",), "aux_layer_shift"),
    "d2t-direct": Scenario("d2t-direct", "d2t saved as direct target ids; SGLang reads offsets",
                           ("draft.topk_target",), "d2t_direct_ids"),
    "no-d2t": Scenario("no-d2t", "d2t left out of the checkpoint; SGLang serves draft id i as target id i",
                       ("draft.topk_target",), "d2t_missing"),
    "norm-before-fc": Scenario("norm-before-fc", "served with norm_before_fc on (an RMSNorm over the aux "
                               "concat) that training never applied", ("draft.fc_in", "draft.fc_out"),
                               "norm_before_fc"),
    # The permutation explanation (each serving slot = another training slot) is replay/diff/explain/aux.py's:
    # set expected_cause to its name once it exists.
    "aux-order": Scenario("aux-order", "a draft trained on HF [6, 0, 3] concatenated in that order (SpecForge "
                          "concatenates its layer list as listed), served with ids {order} = the same layers; "
                          "SGLang concatenates them ascending, HF [0, 3, 6]",
                          ("target.aux.0", "target.aux.1", "target.aux.2", "target.aux_cat"), None,
                          trained_order=(6, 0, 3)),
}


#: the scenarios served by vLLM 0.32.0: the same mistakes in vLLM's key and numbering (id k = HF k, the
#: top-level key read first; gpu_model_runner.py:5268-5283). Off-by-one there is the mirror of SGLang's:
#: the ids written in SGLang's numbering in eagle_config (an SGLang-format draft as shipped); vLLM reads
#: them literally, -1 matches no layer, two of three slots reach fc and the first request crashes in the
#: words of the kernel fc runs on (VLLM.slot_crash: AMX's packed linear, oneDNN's reshape or torch's matmul).
ENGINE_SCENARIOS: dict[str, dict[str, Scenario]] = {"vllm": {
    "seed": dataclasses.replace(SCENARIOS["seed"], summary=(
        "served with top-level eagle_aux_hidden_state_layer_ids {seed} (vLLM id k = HF k: captures HF [3, 6, 7]) "
        "while training used [embedding output, layer 2, layer 5] = HF [0, 3, 6]")),
    "correct": dataclasses.replace(SCENARIOS["correct"], summary=(
        "served with top-level eagle_aux_hidden_state_layer_ids {correct} = HF [0, 3, 6], as trained")),
    "off-by-one": dataclasses.replace(SCENARIOS["off-by-one"], summary=(
        "served as an SGLang-format draft: eagle_config ids {literal} (SGLang's numbering) and no top-level ids; "
        "vLLM reads id k as HF k and captures only HF {literal_hf}: the first request crashes"),
        expected_first=None, expected_cause=None, expected_crash=True),
    "d2t-direct": dataclasses.replace(SCENARIOS["d2t-direct"], summary=(
        "d2t saved as direct target ids; vLLM reads offsets (target = arange(Vd) + d2t, llama_eagle3.py:373-395)")),
    "no-d2t": dataclasses.replace(SCENARIOS["no-d2t"], summary=(
        "d2t left out of the checkpoint; vLLM keeps its zero-initialised map (llama_eagle3.py:338-343) and serves "
        "draft id i as target id i")),
    "norm-before-fc": dataclasses.replace(SCENARIOS["norm-before-fc"], summary=(
        "served with norm_before_fc on (an RMSNorm over the aux concat, llama_eagle3.py:184-188,405-407) that "
        "training never applied")),
    "aux-order": dataclasses.replace(SCENARIOS["aux-order"], summary=(
        "a draft trained on HF [6, 0, 3] concatenated in that order (SpecForge concatenates its layer list as "
        "listed), served with top-level ids {order} = the same layers; vLLM concatenates them ascending, "
        "HF [0, 3, 6] (interfaces.py:1577-1578)")),
}}


def scenario_for(scenario: str, engine: str = DEMO_ENGINE) -> Scenario:
    """The scenario as served by ``engine`` (its summary and expectation in that engine's terms).

    Raises:
        KeyError: unknown scenario.
    """
    if scenario not in SCENARIOS:
        raise KeyError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    return ENGINE_SCENARIOS.get(engine, {}).get(scenario, SCENARIOS[scenario])


def describe(scenario: str, ids: ScenarioIds | None = None) -> str:
    """The scenario's one-line summary with the ids of this target and engine (``ids``; None: the
    Llama demo on SGLang)."""
    ids = ids or scenario_ids()
    sc = scenario_for(scenario, ids.engine)
    text = sc.summary.format(seed=ids.seed, correct=ids.correct, literal=ids.literal, literal_hf=ids.literal_hf,
                             order=ids.ids_for(sc.trained_order) if sc.trained_order else None)
    if ids.architecture in (None, "LlamaForCausalLM") or "{" not in sc.summary:  # no ids in the text
        return text
    return f"{text} [{ids.architecture}: {ids.rule}]"


def _weights_file(draft_dir: Path) -> Path:
    files = sorted(draft_dir.glob("*.safetensors"))
    if len(files) != 1:
        raise FileNotFoundError(f"{draft_dir}: expected one .safetensors file, found {len(files)}")
    return files[0]


def write_served_draft(scenario: str, trained_draft: Path, out: Path, *, ids: ScenarioIds | None = None) -> Path:
    """Copy the trained draft to ``out`` with the scenario's mistake applied; returns ``out``.

    ``ids``: the scenario ids of the target it is served on (:func:`scenario_ids`; None: the Llama
    demo target's).

    Raises:
        KeyError: unknown scenario.
        ValueError: a scenario that is no mistake on this target (off-by-one where the trained HF
            indices written as ids are the correct ids, as on DeepSeek-V3).
    """
    import torch
    from safetensors.torch import load_file, save_file

    from specdiff.eagle3.vocab_map import hot_token_ids

    if scenario not in SCENARIOS:
        raise KeyError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    ids = ids or scenario_ids()
    if scenario == "off-by-one" and ids.literal_hf == list(TRAINED_HF):
        raise ValueError(f"scenario 'off-by-one' is no mistake on {ids.architecture}: ids {ids.literal} capture "
                         f"HF {ids.literal_hf} there, as trained ({ids.rule})")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(trained_draft, out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    set_config_value(cfg, ids.key, list(ids.correct))
    wfile = _weights_file(out)
    weights = load_file(str(wfile))
    if scenario == "seed":
        set_config_value(cfg, ids.key, list(ids.seed))
    elif scenario == "off-by-one":
        set_config_value(cfg, ids.key, None)
        set_config_value(cfg, ids.literal_key, list(ids.literal))
    elif scenario == "d2t-direct":
        d2t = weights["d2t"]
        weights["d2t"] = hot_token_ids(d2t).to(d2t.dtype)  # direct ids
    elif scenario == "no-d2t":
        weights.pop("d2t", None)
        weights.pop("t2d", None)
    elif SCENARIOS[scenario].trained_order is not None:
        order = SCENARIOS[scenario].trained_order
        weights["fc.weight"] = reorder_fc_blocks(weights["fc.weight"], from_order=TRAINED_HF, to_order=order)
        set_config_value(cfg, ids.key, ids.ids_for(order))
    elif scenario == "norm-before-fc":
        cfg["norm_before_fc"] = True
        width = weights["fc.weight"].shape[1]
        weights["input_norm.weight"] = torch.ones(width, dtype=weights["fc.weight"].dtype)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    save_file(weights, str(wfile), metadata={"format": "pt"})
    return out
