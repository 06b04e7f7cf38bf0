"""Alignment survives a different token format: sequences that share only a run of tokens (BOS +
raw text on the training side, a chat template without BOS on the serving side) pair by content,
``tokens`` is the first divergence at the first differing token with a decoded side by side, and
the stages are compared on the common part.

Synthetic traces written by the real TraceWriter, tokenized with the committed demo tokenizer.
"""

from __future__ import annotations

import numpy as np
import pytest

from specdiff.demo.run import REPO_MODELS
from specdiff.replay.diff.align.align import AlignmentError, align_sequences
from specdiff.replay.diff.pipeline import diff_traces
from specdiff.replay.diff.report import render_text
from specdiff.replay.diff.types import Pair
from specdiff.tracer.schema import aux_name
from specdiff.tracer.store import TraceWriter, open_trace

TARGET = REPO_MODELS / "target"
if not (TARGET / "tokenizer.json").exists():
    pytest.skip("the demo tokenizer is not built", allow_module_level=True)

H = 32
EMBED = np.random.default_rng(3).standard_normal((5000, H)).astype(np.float32)
TEXTS = ["def add(a, b):\n    return a + b\n", "import os\nfor name in os.listdir(path):\n    print(name)\n"]


def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TARGET / "tokenizer.json"))


def write_trace(path, *, side: str, seqs: list[list[int]], prompt_lens: list[int]) -> str:
    """Aux rows that depend on the token at each position only, so a common run agrees on both
    sides wherever it starts; tokens rows are the draft input x_{t+1}."""
    contract = {"num_layers": 8, "hidden_size": H, "aux_hf_indices": [0, 3, 6], "dtype": "float32",
                "model_name": str(TARGET)}
    with TraceWriter(str(path), side=side, contract=contract, overwrite=True) as w:
        for toks, plen in zip(seqs, prompt_lens, strict=True):
            toks = np.asarray(toks)
            sid = w.add_sequence(toks, prompt_len=plen)
            n = len(toks) - 1
            for j in range(3):
                w.append(aux_name(j), EMBED[toks[:n]] * (j + 1), seq=sid, pos=np.arange(n))
            w.append("tokens", toks[1:n + 1].astype(np.int64), seq=sid, pos=np.arange(n))
    return str(path)


def test_bos_plus_raw_text_against_a_chat_template_is_a_tokens_divergence_at_position_0(tmp_path):
    tok = tokenizer()
    gen = tok.encode("x = 1\ny = 2\n", add_special_tokens=False).ids
    train = [tok.encode(t).ids + gen for t in TEXTS]  # BOS + raw text (the training data format)
    serve = [tok.encode(f"User: {t}\nAssistant:", add_special_tokens=False).ids + gen for t in TEXTS]
    assert train[0][0] == 0 and serve[0][0] != 0  # BOS on the training side only
    a = write_trace(tmp_path / "train", side="train", seqs=train, prompt_lens=[len(t) - len(gen) for t in train])
    b = write_trace(tmp_path / "serve", side="serve", seqs=serve, prompt_lens=[len(s) - len(gen) for s in serve])
    report = diff_traces(a, b)
    assert report.first is not None and report.first.name == "tokens" and report.first.kind == "tokens"
    assert report.first.first_where == {"pair": 0, "pos": 0, "depth": 0}
    assert report.verdict().startswith("first divergence: tokens at seq 0 pos 0 — the token formats differ")
    assert len(report.alignment.token_formats) == 2
    cause = report.explanations[0]
    assert cause.cause == "token_format"
    assert "BOS (id 0) added on training only" in cause.message
    assert "a space-prefixed first token on serving (' def' vs 'def' on training)" in cause.message
    assert "role markers / a chat template prefix: 'User:'" in cause.message
    ev = "\n".join(cause.evidence)
    assert "'User:" in ev  # the serving side's role marker, decoded
    assert "Assistant:" in ev  # the template suffix after the common part
    # The stages are compared on the common part, and there they agree.
    aux = report.comparisons["target.aux.0"]
    assert aux.stats["rows"] >= 20 and not aux.diverged, aux.stats
    text = render_text(report)
    assert "paired by content" in text and "explanation: token_format" in text


def test_sequences_without_any_common_run_name_the_nearest_pair(tmp_path):
    tok = tokenizer()
    a = write_trace(tmp_path / "a", side="train", seqs=[tok.encode(TEXTS[0]).ids], prompt_lens=[4])
    b = write_trace(tmp_path / "b", side="serve", seqs=[[4000, 4001, 4002, 4003, 4004]], prompt_lens=[2])
    with pytest.raises(AlignmentError, match=r"nearest pair: A seq 0 and B seq 0 .* A starts \[0, ") as e:
        diff_traces(a, b)
    assert "'<|bos|>def" in str(e.value)  # decoded with the tokenizer the contract names


def test_exact_pairs_keep_start_zero_and_no_format(tmp_path):
    tok = tokenizer()
    seqs = [tok.encode(t).ids for t in TEXTS]
    a = write_trace(tmp_path / "a", side="train", seqs=seqs, prompt_lens=[4, 4])
    b = write_trace(tmp_path / "b", side="serve", seqs=seqs[::-1], prompt_lens=[4, 4])
    al = align_sequences(Pair(open_trace(a), open_trace(b)))
    assert [(p.start, p.format) for p in al.seq_pairs] == [(Pair(0, 0), None)] * 2
    assert not al.token_formats
