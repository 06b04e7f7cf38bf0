"""Synthetic trace pairs for the diff's unit tests: one builder instead of a ``write_pair`` per file.

A test describes its pair (which rows serving moves, which facts each contract holds) and
:class:`TracePair` does the rest the tests shared: a training and a serving
:class:`~specdiff.tracer.store.TraceWriter` under one folder, the same token sequence added on both
sides, serving's bf16-sized jitter from a per-(sequence, side) noise generator, and closing.

Data are reproducible by construction: ``TracePair.rng`` (seed 0 unless told) draws what both sides
share, and each side of sequence ``s`` draws its noise from ``default_rng(100 + s + 1000 * side)``
(side 0 training, 1 serving), so a test's numbers do not move when another test changes.
Besides, for the server tests: draft checkpoint copies (:func:`draft_copy`, :func:`first_layer_only`) and
the ``record train`` + ``diff`` round against a serving trace (:func:`train_and_diff`).
Imported by test modules as ``from builders import TracePair`` (pytest's ``pythonpath`` holds tests/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specdiff.tracer.store import TraceWriter

if TYPE_CHECKING:
    import torch


def moved(x: np.ndarray, rng: np.random.Generator, rel: float) -> np.ndarray:
    """``x`` (float32, any shape) moved by ``rel`` of its L2 norm in a random direction drawn from
    ``rng`` (rel 0.2 keeps a row's cosine to the original above 0.97)."""
    d = rng.standard_normal(x.shape).astype(np.float32)
    return (x + rel * np.linalg.norm(x) * d / np.linalg.norm(d)).astype(np.float32)


@dataclass
class PairSide:
    """One side of one sequence of a :class:`TracePair`: where its rows go and its own noise."""

    index: int  # 0 training, 1 serving
    writer: TraceWriter
    seq: int  # the sequence id this side's writer gave the sequence
    noise: np.random.Generator

    @property
    def serving(self) -> bool:
        return self.index == 1

    def jitter(self, x: np.ndarray, rel: float = 2e-3) -> np.ndarray:
        """``x`` as this side recorded it: float32, times ``1 + rel * N(0, 1)`` per element on serving
        (bf16 rounds at ~4e-3 relative), unchanged on training. Both sides draw the noise, so the
        draws after it stay in step."""
        return (x * (1 + rel * self.index * self.noise.standard_normal(x.shape))).astype(np.float32)

    def append(self, name: str, values: np.ndarray, **keys) -> None:
        """Rows of ``name`` for this sequence; ``keys``: ``pos`` and optional ``depth`` / ``iter`` arrays."""
        self.writer.append(name, values, seq=self.seq, **keys)


class TracePair:
    """A training trace and a serving trace over the same sequences, ``root/train.trace`` and
    ``root/serve.trace``.

    ``contract``: facts both sides record; ``train`` / ``serve``: facts merged into one side's
    contract only (a family's MoE facts, a dtype, a weight hash). ``writer_options`` go to both
    :class:`TraceWriter` s (e.g. ``chunk_bytes``). Use as a context manager, or call :meth:`close`;
    either way :attr:`paths` is (training path, serving path).
    """

    def __init__(self, root: Path | str, *, contract: dict, train: dict | None = None, serve: dict | None = None,
                 seed: int = 0, **writer_options):
        root = Path(root)
        self.paths = (str(root / "train.trace"), str(root / "serve.trace"))
        self.rng = np.random.default_rng(seed)
        self.writers = tuple(
            TraceWriter(path, side=side, contract={**contract, **(facts or {})}, overwrite=True, **writer_options)
            for path, side, facts in zip(self.paths, ("train", "serve"), (train, serve)))

    def sides(self, s: int, tokens: np.ndarray, *, prompt_len: int) -> Iterator[PairSide]:
        """Add sequence ``s`` (``tokens`` [n] int) to both traces, training first; yield each side."""
        for index, writer in enumerate(self.writers):
            seq = writer.add_sequence(tokens, prompt_len=prompt_len, rid=f"{writer.side}-{s}")
            yield PairSide(index, writer, seq, np.random.default_rng(100 + s + 1000 * index))

    def close(self) -> tuple[str, str]:
        for writer in self.writers:
            writer.close()
        return self.paths

    def __enter__(self) -> TracePair:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def random_specforge_draft(out: Path, *, aux_ids: list[int], hidden: int = 64, vocab: int = 256,
                           draft_vocab: int = 128, seed: int = 0, num_layers: int = 1) -> torch.Tensor:
    """A random EAGLE-3 draft in SpecForge's format (``LlamaForCausalLMEagle3``, ``midlayer.*``) saved
    to ``out``, for pre-flight tests that need a real checkpoint but no trained weights.

    ``aux_ids``: the config's ``eagle_aux_hidden_state_layer_ids`` in SGLang's numbering. Norm flags
    off, 4 heads (2 KV), MLP 128, rope theta 1e4, ``num_layers`` decoder layers. The draft vocabulary is token ids 0 and 1 plus
    ``draft_vocab - 2`` others drawn with ``torch.manual_seed(seed)``; d2t holds offsets (SGLang's
    ``hot_token_id = d2t + arange``), t2d marks them. Returns the hot ids, int64 [draft_vocab], sorted.
    """
    import torch

    from specdiff.eagle3.norms import NORMS_OFF
    from specdiff.replay.model.checkpoint import save_draft
    from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig

    cfg = Eagle3DraftConfig(hidden_size=hidden, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=hidden // 4, vocab_size=vocab, draft_vocab_size=draft_vocab, num_aux=3,
                            target_hidden_size=hidden, max_position_embeddings=512, rope_theta=10000.0,
                            rope_scaling=None, rms_norm_eps=1e-6, **NORMS_OFF,
                            eagle_aux_hidden_state_layer_ids=list(aux_ids), aux_convention="sglang",
                            num_hidden_layers=num_layers)
    torch.manual_seed(seed)
    model = Eagle3Draft(cfg)
    hot = torch.sort(torch.cat([torch.tensor([0, 1]), torch.randperm(vocab - 2)[:draft_vocab - 2] + 2])).values
    with torch.no_grad():
        model.d2t.copy_(hot - torch.arange(draft_vocab))
        model.t2d.zero_()
        model.t2d[hot] = True
    save_draft(model, out, "specforge")
    return hot


#: the tensors :func:`dataflow_pair` writes, in dataflow order
DATAFLOW = ("tokens", "target.aux.0", "target.aux.1", "target.aux.2", "draft.attn_in", "draft.hidden_out",
            "draft.logits")


def dataflow_pair(root: Path | str, *, contract: dict, train: dict | None = None, serve: dict | None = None,
                  moved: str | None = None, nan: bool = False, seqs: int = 3, length: int = 20, hidden: int = 16,
                  depths: int = 2, nudged: str | None = None, nudge: float = 0.008) -> tuple[str, str]:
    """A :class:`TracePair` holding the draft's dataflow (``DATAFLOW``: tokens, three aux slots,
    ``draft.attn_in``, ``draft.hidden_out`` and ``draft.logits`` at depths ``0..depths-1``), the two sides
    equal up to bf16-sized noise except the tensor ``moved``: serving's rows of it from position 1 on
    moved by 0.3 of their norm (``nan``: made NaN instead), and the tensor ``nudged``: every serving row
    moved by ``nudge`` of its norm (inside the bf16 tolerance, above its rounding). ``contract`` /
    ``train`` / ``serve`` as :class:`TracePair`'s. Returns (training path, serving path)."""
    pair = TracePair(root, contract=contract, train=train, serve=serve)
    rng = pair.rng
    width = {"draft.attn_in": 2 * hidden, "draft.logits": 8}
    for s in range(seqs):
        toks = rng.integers(0, 1000, length + 1 + depths)
        base = {n: rng.standard_normal((depths, length, width.get(n, hidden))).astype(np.float32)
                for n in DATAFLOW[1:]}
        for w in pair.sides(s, toks, prompt_len=4):
            for name, values in base.items():
                v = w.jitter(values, 1e-3)
                if w.serving and name == moved:
                    v[:, 1:] = np.nan if nan else np.stack([moved_rows(v[k, 1:], w.noise) for k in range(depths)])
                if w.serving and name == nudged:
                    v = np.stack([moved_rows(v[k], w.noise, nudge) for k in range(depths)])
                for k in range(depths if name.startswith("draft.") else 1):
                    p = np.arange(length - 1 - k if name.startswith("draft.") else length)
                    w.append(name, v[k, p], pos=p, depth=k)
            for k in range(depths):
                p = np.arange(length - 1 - k) if k else np.arange(length)
                w.append("tokens", toks[1 + k:1 + k + len(p)].astype(np.int64), pos=p, depth=k)
    return pair.close()


def moved_rows(x: np.ndarray, rng: np.random.Generator, rel: float = 0.3) -> np.ndarray:
    """Each row of ``x`` [n, d] moved by ``rel`` of its own norm (:func:`moved` per row)."""
    return np.stack([moved(r, rng, rel) for r in x])


def assert_target_logits_hold_the_greedy_token(trace) -> None:
    """Every ``target.argmax`` row of ``trace`` (an open trace) has a ``target.logits_topk`` row at
    its (seq, pos, depth) whose best logit is the greedy token's (the same id, or one tied with it):
    the recorder took the logits of the forward the greedy token came from, row for row."""
    cols = ("seq", "pos", "depth")
    am_keys, ids_keys = trace.keys("target.argmax", columns=cols), trace.keys("target.logits_topk.ids", columns=cols)
    at = {k: i for i, k in reversed(list(enumerate(zip(*(ids_keys[c].tolist() for c in cols), strict=True))))}
    am = trace.read("target.argmax").reshape(-1)
    ids, vals = trace.read("target.logits_topk.ids"), trace.read("target.logits_topk.values", as_float32=True)
    assert len(am) > 0 and trace.rows("target.logits_topk.ids") == len(am)
    for r, key in enumerate(zip(*(am_keys[c].tolist() for c in cols), strict=True)):
        i = at[key]
        hit = np.nonzero(ids[i] == am[r])[0]
        assert len(hit) and vals[i, hit[0]] == vals[i, 0], (key, int(am[r]), ids[i].tolist())


def specforge_exported_draft(draft_dir: Path, out: Path) -> Path:
    """``draft_dir``'s weights written as a SpecForge 0.2.0 training state (``{"strategy": "eagle3",
    "draft_state_dict": ...}``, the state ``export_to_sglang`` reads) and exported to ``out`` by SpecForge's
    own exporter (specforge/export/to_sglang.py: ``save_pretrained`` + legacy rope keys). Returns ``out``."""
    import contextlib
    import sys

    import torch
    from safetensors.torch import load_file
    from specforge.export.to_sglang import export_to_sglang

    state = out.parent / f"{out.name}-training_state.pt"
    torch.save({"strategy": "eagle3", "draft_state_dict": load_file(str(draft_dir / "model.safetensors"))}, state)
    with contextlib.redirect_stdout(sys.stderr):  # the exporter prints its progress
        export_to_sglang(str(state), str(draft_dir / "config.json"), str(out))
    return out


# ---- draft checkpoints and the record-train + diff round of the server tests ----------------------------
def draft_copy(src: Path, out: Path, *, config: dict | None = None, copy: dict[str, str] | None = None,
               ones: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> Path:
    """A copy of the draft checkpoint ``src`` (config.json + model.safetensors) written to ``out``: the config
    replaced by ``config`` when given, each ``copy`` {name: source name} tensor written as a clone of the
    source tensor, each ``ones`` tensor as ones of its shape and dtype, then every tensor whose name starts with
    a ``drop`` prefix left out. Returns ``out``."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text()) if config is None else config
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    sd = load_file(str(src / "model.safetensors"))
    sd.update({name: sd[source].clone() for name, source in (copy or {}).items()})
    sd.update({name: sd[name].new_ones(sd[name].shape) for name in ones})
    sd = {k: v for k, v in sd.items() if not k.startswith(drop)}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def first_layer_only(draft: Path, out: Path) -> Path:
    """A multi-layer ``draft`` cut to its first layer: config num_hidden_layers 1, the ``layers.{i}.*``
    weights (i >= 1) dropped."""
    cfg = json.loads((draft / "config.json").read_text())
    later = tuple(f"layers.{i}." for i in range(1, cfg["num_hidden_layers"]))
    return draft_copy(draft, out, config={**cfg, "num_hidden_layers": 1}, drop=later)


def serve_demo_prompts(draft: Path, tmp_path: Path, *extra_args: str, prompts: int = 2,
                       max_new_tokens: int = 16) -> tuple[Path, list]:
    """Serve ``draft`` with the demo target on a traced SGLang CPU server (``extra_args``: more server options),
    the first ``prompts`` demo prompts one after the other; the trace ``tmp_path/serve.trace`` and each
    request's ``spec_accept_length`` (None where SGLang gave none). Its log: ``tmp_path/server.log``."""
    import os

    from specdiff.demo.run import REPO_MODELS, demo_prompts
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    serve = tmp_path / "serve.trace"
    accepted = []
    with ServerProcess(REPO_MODELS / "target", draft_model_path=draft, spec=SpecSettings(),
                       env=dict(os.environ, SPECDIFF_TRACE=str(serve)), extra_args=list(extra_args),
                       log_path=tmp_path / "server.log") as server:
        for ids in demo_prompts(REPO_MODELS, prompts):
            out = server.generate(input_ids=ids, max_new_tokens=max_new_tokens)
            accepted.append(out.get("meta_info", {}).get("spec_accept_length"))
    return serve, accepted


def train_and_diff(draft: Path, serve: Path, train: Path, *extra) -> subprocess.CompletedProcess:
    """``specdiff record train --target traces/models/target --draft DRAFT --replay SERVE -o TRAIN EXTRA``
    (asserted to succeed), then ``specdiff diff TRAIN SERVE --format json --no-narrow``: the diff's process."""
    from specdiff.demo.run import REPO_MODELS

    cli = [sys.executable, "-m", "specdiff.tui"]
    rec = subprocess.run([*cli, "record", "train", "--target", REPO_MODELS / "target", "--draft", draft,
                          "--replay", serve, "-o", train, *extra], capture_output=True, text=True)
    assert rec.returncode == 0, rec.stderr[-2000:]
    return subprocess.run([*cli, "diff", train, serve, "--format", "json", "--no-narrow"], capture_output=True,
                          text=True)


def write_stored_features(out: Path, fmt: str, tokens: list, slots: list, last: list, *, gz: bool = False) -> Path:
    """A trainer's stored features in its own file format, in ``out`` (returned), one sample per sequence.

    ``tokens[i]`` int [T]; ``slots[i]`` [T, K, H] the aux hidden states in the files' concat order; ``last[i]``
    [T, H] the last hidden state the format stores (SpecForge: after the final norm, speculators: vLLM id L,
    before it). SpecForge (``fmt`` ``"specforge"``): SpecForge 0.2.0's own writer, ``LocalFeatureStore`` with a
    dump dir (runtime/data_plane/feature_store.py:398-402: ``torch.save`` of the tensors to
    ``{sample_id}.ckpt``), the dict ``scripts/prepare_hidden_states.py`` persists ({input_ids [T], loss_mask [T],
    hidden_state [1, T, H], aux_hidden_state [1, T, K*H]}); ``gz``: its compressed form instead,
    ``torch.save`` into ``gzip.open`` (prepare_hidden_states.py:474-478), ``data_{i}.ckpt.gz``. speculators:
    ``hs_{i}.safetensors`` as vLLM 0.32.0's extract_hidden_states connector writes it
    (example_hidden_states_connector.py:415-418, ``save_file``): {hidden_states [T, K+1, H], token_ids [T]}.
    """
    import gzip

    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for i, (ids, aux, lh) in enumerate(zip(tokens, slots, last, strict=True)):
        ids = torch.as_tensor(np.asarray(ids), dtype=torch.int64)
        if fmt == "speculators":
            save_file({"hidden_states": torch.cat([aux, lh[:, None]], 1).contiguous(), "token_ids": ids},
                      str(out / f"hs_{i}.safetensors"))
            continue
        record = {"input_ids": ids, "loss_mask": torch.ones(len(ids), dtype=torch.long),
                  "hidden_state": lh[None].contiguous(), "aux_hidden_state": aux.flatten(1)[None].contiguous()}
        if gz:
            with gzip.open(out / f"data_{i}.ckpt.gz", "wb") as fh:
                torch.save(record, fh)
        else:
            from specforge.runtime.data_plane.feature_store import LocalFeatureStore

            LocalFeatureStore(dump_dir=str(out)).put(record, sample_id=f"data_{i}", metadata={})
    return out
