"""Built-in demo scenarios: a correctly trained draft, served with one real-world contract mistake.

Each scenario writes the *served* copy of the demo draft (what the user shipped to SGLang);
the training side always replays with the draft as it was trained. The demo draft was trained
on HF hidden_states [0, 3, 6] (embedding output, outputs of layers 2 and 5): in SGLang's
convention (id k captures HF k+1; -1 = embeddings) that is ids [-1, 2, 5].
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

TRAINED_HF = [0, 3, 6]
CORRECT_SGLANG_IDS = [-1, 2, 5]


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

    def check(self, report) -> tuple[bool, str]:
        """Whether ``report`` (a ``replay.report.DiffReport``) found what this scenario seeded,
        and one line saying so."""
        first = report.first.name if report.first is not None else None
        causes = [e.cause for e in report.explanations]
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
    "seed": Scenario("seed", "served with eagle_aux_hidden_state_layer_ids [2, 5, 6] (captures HF [3, 6, 7]) "
                     "while training used [embedding output, layer 2, layer 5] = HF [0, 3, 6]",
                     ("target.aux.0",), "aux_layer_shift"),
    "correct": Scenario("correct", "served with eagle_aux_hidden_state_layer_ids [-1, 2, 5] = HF [0, 3, 6], "
                        "as trained", None, None),
    "off-by-one": Scenario("off-by-one", "served with ids [0, 3, 6] written as HF / vLLM indices; SGLang reads "
                           "id k as HF k+1 and captures HF [1, 4, 7]", ("target.aux.0",), "aux_layer_shift"),
    "d2t-direct": Scenario("d2t-direct", "d2t saved as direct target ids; SGLang reads offsets",
                           ("draft.topk_target",), "d2t_direct_ids"),
    "no-d2t": Scenario("no-d2t", "d2t left out of the checkpoint; SGLang serves draft id i as target id i",
                       ("draft.topk_target",), "d2t_missing"),
    "norm-before-fc": Scenario("norm-before-fc", "served with norm_before_fc on (an RMSNorm over the aux "
                               "concat) that training never applied", ("draft.fc_in", "draft.fc_out"),
                               "norm_before_fc"),
}


def _weights_file(draft_dir: Path) -> Path:
    files = sorted(draft_dir.glob("*.safetensors"))
    if len(files) != 1:
        raise FileNotFoundError(f"{draft_dir}: expected one .safetensors file, found {len(files)}")
    return files[0]


def write_served_draft(scenario: str, trained_draft: Path, out: Path) -> Path:
    """Copy the trained draft to ``out`` with the scenario's mistake applied; returns ``out``."""
    if scenario not in SCENARIOS:
        raise KeyError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(trained_draft, out)
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    eagle = cfg.setdefault("eagle_config", {})
    eagle["eagle_aux_hidden_state_layer_ids"] = list(CORRECT_SGLANG_IDS)
    wfile = _weights_file(out)
    weights = load_file(str(wfile))
    if scenario == "seed":
        eagle["eagle_aux_hidden_state_layer_ids"] = [2, 5, 6]
    elif scenario == "off-by-one":
        eagle["eagle_aux_hidden_state_layer_ids"] = list(TRAINED_HF)
    elif scenario == "d2t-direct":
        d2t = weights["d2t"]
        weights["d2t"] = d2t + torch.arange(len(d2t), dtype=d2t.dtype)
    elif scenario == "no-d2t":
        weights.pop("d2t", None)
        weights.pop("t2d", None)
    elif scenario == "norm-before-fc":
        cfg["norm_before_fc"] = True
        width = weights["fc.weight"].shape[1]
        weights["input_norm.weight"] = torch.ones(width, dtype=weights["fc.weight"].dtype)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    save_file(weights, str(wfile), metadata={"format": "pt"})
    return out
