"""Benchmark: what the contract's weight facts cost at recorder start-up.

    python benchmarks/contract_startup.py [--target DIR] [--draft DIR] [--rounds 5]
    python benchmarks/contract_startup.py --server [--rounds 2]

The serving recorders fingerprint every checkpoint tensor on the engine's load path and note which
parameters the loading wrote (tracer/weight_facts.py ``LoadWatch``: a strided sample of each tensor,
a ``TorchFunctionMode`` over the load, 64 probe elements per parameter before and after), then read the
structure as built; ``record train`` reads the same fingerprints from the checkpoint files through a
memory map (``checkpoint_fingerprints``). Default: in this process, on the shipped demo target
(traces/models/target, else ``--target``), the load an engine does (a model built from the config on
the meta-free CPU, every safetensors tensor copied into its parameter) timed without and with the watch
and the facts read after it; ``record train``'s file reader against ``from_pretrained``. Each timing is
the median of ``--rounds`` (the page cache warm after a first untimed load). Prints the seconds and the
ratio with / without.

``--server``: the real thing, on the CPU SGLang recipe: servers started one after the other with
``SPECDIFF_TRACE`` set and ``SPECDIFF_WEIGHT_FACTS`` 1 or 0 (alternating, ``--rounds`` each), time to
``/health`` (the recorder's start-up is inside it: its contract is written before the server is ready).
This VM's speed swings by +-14 % between runs (benchmarks/recorder_overhead.py), more than the facts
cost on the demo target: the in-process numbers are the measurement, the server run the check that
nothing else moved.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(model, files, watch=None) -> float:
    """Copy every checkpoint tensor of ``files`` into ``model`` as an engine loads (a (name, tensor)
    iterator, ``param.data.copy_``), under ``watch`` when given, and read the facts after it; seconds."""
    import torch
    from safetensors import safe_open

    from specdiff.tracer.weight_facts import structure, unit_fingerprints

    def weights():
        for f in files:
            with safe_open(str(f), framework="pt") as sf:
                for name in sf.keys():
                    yield name, sf.get_tensor(name)

    params = dict(model.named_parameters())
    t0 = time.perf_counter()
    it = weights() if watch is None else watch.wrap(weights())
    with torch.no_grad(), (watch if watch is not None else contextlib.nullcontext()):
        for name, t in it:
            if name in params:
                params[name].data.copy_(t)
    if watch is not None:
        watch.unwritten()
        unit_fingerprints(watch.fingerprints)
        structure(model, per_unit=True)
    return time.perf_counter() - t0


def in_process(target: Path, rounds: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdiff.tracer.weight_facts import LoadWatch, checkpoint_fingerprints

    files = sorted(target.glob("*.safetensors"))
    if not files:
        sys.exit(f"{target}: no *.safetensors files")
    cfg = AutoConfig.from_pretrained(str(target), local_files_only=True)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    size = sum(f.stat().st_size for f in files) / 2**20
    n = sum(1 for _ in model.parameters())
    _load(model, files)  # warm the page cache
    plain, watched = [], []
    for _ in range(rounds):
        plain.append(_load(model, files))
        watched.append(_load(model, files, LoadWatch(model)))
    p, w = statistics.median(plain), statistics.median(watched)
    print(f"target {target} ({size:.0f} MiB, {n} parameters), median of {rounds} rounds")
    print(f"  engine load path:  without {p:.3f} s   with the weight facts {w:.3f} s   ratio {w / p:.2f}x   "
          f"(+{w - p:.3f} s)")
    reads, loads = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        checkpoint_fingerprints(target)
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.bfloat16, local_files_only=True)
        loads.append(time.perf_counter() - t0)
    r, ld = statistics.median(reads), statistics.median(loads)
    print(f"  record train:      from_pretrained {ld:.3f} s   + fingerprints from the files {r:.3f} s   "
          f"ratio {(ld + r) / ld:.2f}x")


def with_servers(rounds: int) -> None:
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    models = ROOT / "traces" / "models"
    base = {k: v for k, v in os.environ.items() if not k.startswith("SPECDIFF_")}
    times: dict[str, list[float]] = {"1": [], "0": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(2 * rounds):
            facts = "1" if k % 2 == 0 else "0"
            env = dict(base, SPECDIFF_TRACE=os.path.join(tmp, f"s{k}.trace"), SPECDIFF_WEIGHT_FACTS=facts,
                       SPECDIFF_WRITER="thread")
            with ServerProcess(models / "target", draft_model_path=models / "draft", spec=SpecSettings(), env=env,
                               startup_timeout_s=1800) as srv:
                times[facts].append(srv.startup_s)
            print(f"  server {k}: weight facts {'on' if facts == '1' else 'off'}: ready in {srv.startup_s:.1f} s",
                  flush=True)
    on, off = statistics.median(times["1"]), statistics.median(times["0"])
    print(f"CPU SGLang server start-up (median of {rounds}): without {off:.1f} s   with the weight facts {on:.1f} s   "
          f"ratio {on / off:.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / "traces" / "models" / "target")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--server", action="store_true", help="time real CPU SGLang servers instead")
    args = ap.parse_args()
    if args.server:
        with_servers(args.rounds)
    else:
        in_process(args.target, args.rounds)


if __name__ == "__main__":
    main()
