"""Regenerate the shipped example pair, ``traces/examples/seed/{serve,train}.trace``, from the
committed tiny models (``traces/models``) on a real CPU SGLang server (~2-3 min on 2 cores)::

    .venv/bin/python traces/examples/regenerate.py            # rewrites traces/examples/seed/
    .venv/bin/python traces/examples/regenerate.py --out DIR  # elsewhere (tests/demo/test_example_pair.py)

It runs what ``specdiff demo --scenario seed --prompts 3 --no-tui`` runs (demo/run.py: the seed's
served draft, the traced server, ``record train`` replaying the served sequences) from the repo
root with repo-relative paths and ``SPECDIFF_RECORD_RELATIVE_TO`` set to the repo root (recorders
write absolute paths otherwise: ``specdiff.tracer.paths``), so the contracts name
``traces/models/target``, the served draft and the serving trace as a fresh clone has them, not as
the recording machine did. The served
draft (``OUT/served-draft``) is the trained draft with the seed's ``eagle_aux_hidden_state_layer_ids``
in its config.json; its weights are a relative symlink to ``traces/models/draft``'s (the seed
changes no weight), so the repo holds no second copy. Both traces are then compacted
(``specdiff upgrade --compact``: chunks no larger than their rows), values unchanged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path("traces/models")  # relative to ROOT: the contracts name it so
EXAMPLE = Path("traces/examples/seed")
SCENARIO, PROMPTS, MAX_NEW_TOKENS = "seed", 3, 96


def served_draft(out: Path, ids) -> Path:
    """``out`` = the trained draft with the seed's ids (demo/scenarios.py write_served_draft), its
    weights -- the same tensors, saved again -- replaced by a relative symlink to the trained draft's."""
    import torch
    from safetensors.torch import load_file

    from specdiff.demo.scenarios import write_served_draft

    write_served_draft(SCENARIO, MODELS / "draft", out, ids=ids)
    for f in (MODELS / "draft").glob("*.safetensors"):
        copy = out / f.name
        a, b = load_file(str(f)), load_file(str(copy))
        if a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a):
            copy.unlink()
            copy.symlink_to(os.path.relpath(f, out))
    return out


def regenerate(out: Path) -> tuple[Path, Path]:
    """Write ``out/{served-draft, serve.trace, train.trace}`` (``out`` relative to the repo root,
    which is the working directory). Returns (train, serve).

    Raises:
        SystemExit: the committed models are absent (one line saying how to build them).
        DemoError, ServerError: the server or ``record train`` failed (demo/run.py).
    """
    import json

    from specdiff.eagle3.aux_layers import target_architecture
    from specdiff.tracer.store.upgrade import upgrade
    from specdiff.demo.run import demo_prompts, record_train, serve_and_trace
    from specdiff.demo.scenarios import scenario_for, scenario_ids

    if not (MODELS / "draft" / "config.json").is_file():
        sys.exit(f"regenerate: {MODELS} is not built (python -m specdiff.demo_models.tiny_models --out {MODELS})")
    tcfg = json.loads((MODELS / "target" / "config.json").read_text())
    ids = scenario_ids(target_architecture(tcfg), int(tcfg["num_hidden_layers"]), "sglang")
    out.mkdir(parents=True, exist_ok=True)
    draft = served_draft(out / "served-draft", ids)
    serve, train = out / "serve.trace", out / "train.trace"
    for p in (serve, train):
        if p.exists():
            shutil.rmtree(p)
    from specdiff.tracer.paths import RELATIVE_TO_ENV

    os.environ[RELATIVE_TO_ENV] = str(ROOT)  # record train (a subprocess) writes repo-relative paths too
    with tempfile.TemporaryDirectory() as tmp:
        serve_and_trace(models=MODELS, served_draft=draft, trace=serve,
                        prompts=demo_prompts(MODELS, PROMPTS), max_new_tokens=MAX_NEW_TOKENS,
                        log_path=Path(tmp) / "server.log",
                        env={k: v for k, v in os.environ.items() if not k.startswith("SPECDIFF_")}
                        | {"SPECDIFF_TRACE": str(serve), RELATIVE_TO_ENV: str(ROOT)})
    record_train(models=MODELS, serve_trace=serve, out=train, extra=scenario_for(SCENARIO).training_args())
    for trace in (serve, train):  # raw float chunks are stored whole (~4 MiB): 118 MB of padding here
        small = trace.with_name(f".{trace.name}.compact")
        if small.exists():
            shutil.rmtree(small)
        upgrade(str(trace), str(small), compact=True)
        shutil.rmtree(trace)
        small.rename(trace)  # back under the name the training contract's replay_of gives
    return train, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=EXAMPLE,
                        help=f"where the pair goes, relative to the repo root or absolute (default {EXAMPLE})")
    args = parser.parse_args(argv)
    out = args.out if not args.out.is_absolute() else Path(os.path.relpath(args.out, ROOT))
    os.chdir(ROOT)
    train, serve = regenerate(out)
    print(f"{train}\n{serve}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
