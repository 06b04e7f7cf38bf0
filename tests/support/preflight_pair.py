"""The pre-flight tests' tiny pair (``specdiff check``, tests/replay/preflight/): its sizes and the
edits the tests make to a copy of it; the ``pair_src`` / ``pair`` fixtures that build it are
tests/replay/preflight/conftest.py's.

The pair is self-contained (built under tmp_path): an 8-layer Llama target config (no weights
needed: check never loads them) and a random EAGLE-3 draft saved in SpecForge format with
SGLang ids [-1, 3, 6] (= HF [0, 4, 7]) in eagle_config and the same layers as vLLM ids [0, 4, 7]
at the top level, so both engines feed the training layers.
"""

from __future__ import annotations

import json

from safetensors.torch import load_file, save_file

from specdiff.replay.preflight.report import Finding

#: target layers, hidden size, target vocab, draft vocab
L, H, V, VD = 8, 64, 256, 128
#: the layers the draft was trained on (HF indices), as ``--training-layers`` takes them
TRAIN_HF = "0,4,7"


def edit_config(path, fn):
    """``fn(config)`` edits the ``config.json`` dict of the checkpoint folder ``path`` in place."""
    f = path / "config.json"
    c = json.loads(f.read_text())
    fn(c)
    f.write_text(json.dumps(c))


def edit_weights(path, fn):
    """``fn(state_dict)`` edits the tensors of ``path/model.safetensors`` in place."""
    f = path / "model.safetensors"
    sd = load_file(str(f))
    fn(sd)
    save_file(sd, str(f))


def one_finding(report, kind, engine=None) -> Finding:
    """The first finding of ``kind`` (for ``engine`` when given) in ``report``; AssertionError naming
    the findings there are when there is none."""
    got = [f for f in report.findings if f.kind == kind and (engine is None or f.engine == engine)]
    assert got, f"no {kind} finding in {[(f.kind, f.engine) for f in report.findings]}"
    return got[0]
