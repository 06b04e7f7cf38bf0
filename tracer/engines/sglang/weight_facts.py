"""The draft's embedding and lm_head facts, read from SGLang's live objects (SGLang 0.5.23, worker v2):
``embed_sha256`` / ``lm_head_sha256`` and whose tensor each is (``embed_source`` / ``lm_head_source``).
"""

from __future__ import annotations

import logging

from specdiff.tracer.contract import UNKNOWN
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.reading import read_chain, target_language_model

__all__ = ["weights_facts"]

logger = logging.getLogger("specdiff.tracer")


def _same_tensor(a, b) -> bool:
    # an empty tensor's pointer is 0 like every other empty tensor's: it proves no sharing (weight_facts.not_provided)
    return (a is not MISSING and b is not MISSING and a.numel() > 0 and a.data_ptr() == b.data_ptr()
            and a.shape == b.shape)


def _weight_sha(w, rows, what: str):
    """weight_sha256 of the first ``rows`` rows, or UNKNOWN (shard of a TP rank, or rows unknown)."""
    from specdiff.tracer.contract import weight_sha256

    if w is MISSING or not isinstance(rows, int):
        return UNKNOWN
    if w.shape[0] < rows:
        logger.warning("specdiff: the draft's %s holds %d of %d rows on this rank (tensor parallel); "
                       "its sha256 is unknown", what, w.shape[0], rows)
        return UNKNOWN
    return weight_sha256(w, rows=rows)


def weights_facts(A: SGLangAdapter, *, target_runner, dmodel, dinner, vocab, draft_vocab) -> dict:
    """sha256 and source of the embedding and lm_head the draft multiplies by.

    SGLang 0.5.23 EagleDraftWorker.init_lm_head: an EAGLE-3 draft gets the embedding the target's
    ``get_embed_and_head`` returns (``set_embed``; the target's is found per family through
    ``target_language_model``) and keeps its own lm_head unless ``load_lm_head_from_target``; "source" is
    'target' when the draft's weight is the target's very tensor, else 'draft'.
    """
    lm, lay, _via, _ = target_language_model(A, read_chain(A, target_runner, "ModelRunner.model"))
    tembed = read_chain(A, lm, lay.key("model"), lay.key("embed_tokens"), "VocabParallelEmbedding.weight")
    thead = read_chain(A, lm, lay.key("lm_head"), "VocabParallelEmbedding.weight")
    dembed = read_chain(A, dinner, "Eagle3LlamaModel.embed_tokens", "VocabParallelEmbedding.weight")
    dhead = read_chain(A, dmodel, "LlamaForCausalLMEagle3.lm_head", "VocabParallelEmbedding.weight")
    out = {"embed_sha256": _weight_sha(dembed, vocab, "embedding"),
           "lm_head_sha256": _weight_sha(dhead, draft_vocab, "lm_head")}
    out["embed_source"] = (UNKNOWN if MISSING in (dembed, tembed) else
                           "target" if _same_tensor(dembed, tembed) else "draft")
    out["lm_head_source"] = (UNKNOWN if dhead is MISSING or (thead is MISSING and tembed is MISSING) else
                             "target" if _same_tensor(dhead, thead) or _same_tensor(dhead, tembed) else "draft")
    return out
