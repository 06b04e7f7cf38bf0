"""What `record train --target-backend sglang` asks SGLang to capture (replay/record/engine_target.py), without a
server: the SGLang ids of the training layers under the target's model-file rule, the engine's ascending slots put
back into training's concat order, and what the engine cannot return refused with one line."""

from __future__ import annotations

import pytest

from specdiff.replay.record.engine_target import EngineSettings, sglang_capture_ids
from specdiff.replay.trainers.errors import RecordTrainError


def test_llama_ids_are_hf_minus_one_and_the_listed_order_is_restored():
    # SGLang 0.5.23 llama.py:929-941 captures id k as HF k+1; the engine concatenates ascending
    ids, order = sglang_capture_ids([7, 3, 6], num_layers=8, architecture="LlamaForCausalLM")
    assert ids == [6, 2, 5] and order == [2, 0, 1]


def test_deepseek_reads_its_ids_literally():
    # SGLang 0.5.23 deepseek_v2.py:3458-3473: ids read as given unless the first is 1
    ids, order = sglang_capture_ids([3, 6, 7], num_layers=8, architecture="DeepseekV3ForCausalLM")
    assert ids == [3, 6, 7] and order == [0, 1, 2]


def test_the_embedding_output_is_refused_with_the_engines_reason():
    with pytest.raises(RecordTrainError, match=r"SGLang ids \[-1, 2, 5\].*refuses a negative id"):
        sglang_capture_ids([0, 3, 6], num_layers=8, architecture="LlamaForCausalLM")


def test_a_layer_sglang_never_captures_is_refused():
    # the last decoder layer's output: llama's id L-1 is silently dropped by SGLang
    with pytest.raises(RecordTrainError, match="--target-backend sglang"):
        sglang_capture_ids([3, 6, 8], num_layers=8, architecture="LlamaForCausalLM")


def test_engine_args_are_passed_as_given_and_what_record_train_sets_is_refused():
    s = EngineSettings.parse(tp_size=2, engine_args="--ep-size 2 --mem-fraction-static 0.5", device="cpu")
    assert s.server_args() == ["--tp-size", "2", "--ep-size", "2", "--mem-fraction-static", "0.5"]
    with pytest.raises(RecordTrainError, match="--dtype is set by record train"):
        EngineSettings.parse(tp_size=None, engine_args="--dtype=float16", device="cpu")
