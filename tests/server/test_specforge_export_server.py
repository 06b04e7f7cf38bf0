"""A SpecForge-exported draft served by a real SGLang 0.5.23 CPU server against its training side
computed by SpecForge 0.2.0's own draft model (the trainer's own forward on the training side).

The shipped draft's weights go through SpecForge's own exporter (specforge/export/to_sglang.py
``export_to_sglang``: its training state -> ``save_pretrained`` + legacy rope keys); SGLang serves the
exported directory as it is; ``record train --trainer specforge`` builds SpecForge's
``LlamaForCausalLMEagle3`` from that same directory (replay/trainers/specforge.py) and runs its TTT loop
on the served sequences. The pair agrees: diff exit 0, no divergence, and both sides name the draft
directory they built from. One server start.
"""

from __future__ import annotations

import json

import pytest

from specdiff.demo.run import REPO_MODELS
from specdiff.tracer.store import open_trace

pytest.importorskip("specforge", reason="SpecForge 0.2.0 is installed by `make install` (--no-deps)")

from builders import serve_demo_prompts, specforge_exported_draft, train_and_diff  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.slow]


def test_a_specforge_exported_draft_served_by_sglang_matches_specforge_training(tmp_path):
    exported = specforge_exported_draft(REPO_MODELS / "draft", tmp_path / "exported")
    serve, accepted = serve_demo_prompts(exported, tmp_path)
    train = tmp_path / "train.trace"
    proc = train_and_diff(exported, serve, train, "--trainer", "specforge")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert json.loads(proc.stdout)["first_divergence"] is None
    t, s = open_trace(str(train)).contract, open_trace(str(serve)).contract
    assert t["trainer"] == "specforge" and t["draft_name"] == s["draft_name"] == str(exported.resolve())
    lengths = [a for a in accepted if a is not None]
    assert lengths and min(lengths) > 1.5, accepted  # the exported draft really drafts
