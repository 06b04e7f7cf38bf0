"""The weight facts read on the load path (tracer/weight_facts.py): a fingerprint per checkpoint tensor
that is the same whether an engine's weight iterator or ``record train``'s file reader computed it,
and the parameters a model built that its checkpoint did not provide.

A tiny model is "loaded" here the way SGLang's loaders do it (a ``(name, tensor)`` iterator, each tensor
copied into its parameter's ``.data``, stacked shards through a narrowed view), under ``LoadWatch``.
"""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import save_file

from specdiff.tracer.weight_facts import (
    SAMPLE,
    LoadWatch,
    checkpoint_fingerprints,
    not_provided,
    structure,
    tensor_fingerprint,
    unit_fingerprints,
    weight_unit,
)


class Tiny(torch.nn.Module):
    """Two "decoder layers" with a fused qkv (as an engine builds them) and an embedding."""

    def __init__(self, layers: int = 2):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(32, 8)
        self.layers = torch.nn.ModuleList(torch.nn.ModuleDict({"qkv": torch.nn.Linear(8, 24, bias=False),
                                                                "norm": torch.nn.LayerNorm(8)})
                                          for _ in range(layers))
        with torch.no_grad():
            for p in self.parameters():
                p.fill_(float("nan"))  # "as allocated"


def _checkpoint(path, layers: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {"embed_tokens.weight": torch.randn(32, 8, generator=g).to(torch.bfloat16)}
    for i in range(layers):
        for s in "qkv":
            sd[f"layers.{i}.{s}_proj.weight"] = torch.randn(8, 8, generator=g).to(torch.bfloat16)
        sd[f"layers.{i}.norm.weight"] = torch.ones(8, dtype=torch.bfloat16)
        sd[f"layers.{i}.norm.bias"] = torch.zeros(8, dtype=torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path / "model.safetensors"))
    return sd


def _engine_load(model: Tiny, weights) -> None:
    """Load like an engine: stacked q/k/v shards into the fused qkv through a narrowed view."""
    params = dict(model.named_parameters())
    for name, t in weights:
        for j, s in enumerate("qkv"):
            if f".{s}_proj." in name:
                fused = params[name.replace(f"{s}_proj", "qkv")]
                fused.data.narrow(0, 8 * j, 8).copy_(t)
                break
        else:
            params[name].data.copy_(t)


def test_the_engine_load_path_and_the_file_reader_fingerprint_alike(tmp_path):
    sd = _checkpoint(tmp_path / "ckpt")
    model = Tiny()
    watch = LoadWatch(model)
    with watch:
        _engine_load(model, watch.wrap(iter(sd.items())))
    assert watch.fingerprints == checkpoint_fingerprints(tmp_path / "ckpt")
    assert set(watch.fingerprints) == set(sd)
    assert watch.unwritten() == []


def test_a_fingerprint_is_dtype_independent_and_tells_other_values_apart():
    w = torch.randn(300, 70).to(torch.bfloat16)
    assert tensor_fingerprint(w) == tensor_fingerprint(w.float())  # one bf16 checkpoint held in fp32
    other = w.clone()
    other[::7] += 1
    assert tensor_fingerprint(other) != tensor_fingerprint(w)
    assert tensor_fingerprint(w.reshape(70, 300)) != tensor_fingerprint(w)  # the shape is hashed
    assert tensor_fingerprint(torch.arange(5)) != tensor_fingerprint(torch.arange(5) + 1)


def test_the_sample_is_strided_over_the_whole_tensor():
    big = torch.zeros(SAMPLE * 10)
    late = big.clone()
    late[-10] = 1.0  # the sample reads every 10th element: this one is read
    assert tensor_fingerprint(late) != tensor_fingerprint(big)


def test_parameters_the_checkpoint_did_not_provide_are_named(tmp_path):
    sd = _checkpoint(tmp_path / "ckpt", layers=1)  # the model builds two layers
    model = Tiny(layers=2)
    watch = LoadWatch(model)
    with watch:
        _engine_load(model, watch.wrap(iter(sd.items())))
    assert watch.unwritten() == ["layers.1.norm.bias", "layers.1.norm.weight", "layers.1.qkv.weight"]
    assert not_provided(watch.unwritten(), model) == watch.unwritten()


def test_a_parameter_replaced_by_another_models_tensor_is_provided(tmp_path):
    sd = _checkpoint(tmp_path / "ckpt")
    del sd["embed_tokens.weight"]  # an EAGLE-3 draft: the engine shares the target's embedding after loading
    draft, target = Tiny(), Tiny()
    watch = LoadWatch(draft)
    with watch:
        _engine_load(draft, watch.wrap(iter(sd.items())))
    left = watch.unwritten()
    assert left == ["embed_tokens.weight"]
    draft.embed_tokens.weight = target.embed_tokens.weight  # set_embed
    assert not_provided(left, draft, shared_from=target) == []
    assert not_provided(left, Tiny(), shared_from=target) == ["embed_tokens.weight"]


def test_a_write_from_a_loader_thread_is_seen_by_its_changed_bits(tmp_path):
    sd = _checkpoint(tmp_path / "ckpt")
    model = Tiny()
    watch = LoadWatch(model)
    with watch:  # the mode sees this thread's ops only: the loader thread's copies change the bits
        t = threading.Thread(target=_engine_load, args=(model, watch.wrap(iter(sd.items()))))
        t.start()
        t.join()
    assert watch.unwritten() == []


def test_a_loader_thread_writing_the_allocated_values_is_provided_by_name(tmp_path):
    # SGLang's DeepSeek loader copies on a thread pool (deepseek_weight_loader.py:291); RMSNorm weights
    # are allocated as ones and a random checkpoint's are ones: no op seen, no bits changed. A correct
    # DeepSeek-V3 pair read every norm "left as allocated"
    sd = _checkpoint(tmp_path / "ckpt", layers=1)  # norm weight ones, bias zeros
    model = Tiny(layers=2)
    with torch.no_grad():
        for layer in model.layers:
            layer["norm"].weight.fill_(1.0)
            layer["norm"].bias.fill_(0.0)
    watch = LoadWatch(model)
    with watch:
        t = threading.Thread(target=_engine_load, args=(model, watch.wrap(iter(sd.items()))))
        t.start()
        t.join()
    # layer 0's norm: its own checkpoint tensor's values; layer 1's: the checkpoint has no such tensor
    assert watch.unwritten() == ["layers.1.norm.bias", "layers.1.norm.weight", "layers.1.qkv.weight"]


def test_units_group_a_target_by_decoder_layer():
    assert weight_unit("model.layers.3.mlp.experts.7.up_proj.weight") == "model.layers.3"
    assert weight_unit("model.embed_tokens.weight") == "model.embed_tokens"
    assert weight_unit("d2t") == "d2t"
    fps = {"model.layers.0.a.weight": "1", "model.layers.0.b.weight": "2", "model.layers.1.a.weight": "3"}
    units = unit_fingerprints(fps)
    assert set(units) == {"model.layers.0", "model.layers.1"}
    assert unit_fingerprints({**fps, "model.layers.0.b.weight": "9"})["model.layers.0"] != units["model.layers.0"]
    assert unit_fingerprints({**fps, "model.layers.0.b.weight": "9"})["model.layers.1"] == units["model.layers.1"]


def test_structure_as_built_per_parameter_and_per_unit():
    m = Tiny()
    rows = structure(m, per_unit=False)
    assert rows["layers.0.qkv.weight"] == "[24, 8] float32"
    per = structure(m, per_unit=True)
    assert per["layers.0"].startswith("3 params sha ") and per["layers.0"] == per["layers.1"]
    assert set(per) == {"embed_tokens", "layers.0", "layers.1"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_file_reader_reads_every_stored_dtype(tmp_path, dtype):
    t = torch.randn(40, 30).to(dtype)
    tmp_path.mkdir(exist_ok=True)
    save_file({"w": t, "ids": torch.arange(7), "mask": torch.ones(5, dtype=torch.bool)}, str(tmp_path / "m.safetensors"))
    got = checkpoint_fingerprints(tmp_path)
    assert got == {"w": tensor_fingerprint(t), "ids": tensor_fingerprint(torch.arange(7)),
                   "mask": tensor_fingerprint(torch.ones(5, dtype=torch.bool))}


def test_an_emptied_parameter_is_never_taken_for_another_models(tmp_path):
    """A weight an engine empties after packing it for its kernel (vLLM 0.32.0 on a CPU: torch.empty(0))
    has storage pointer 0, as every emptied weight of the target has: that proves no sharing."""
    import torch

    sd = _checkpoint(tmp_path / "ckpt", layers=1)
    draft, target = Tiny(layers=2), Tiny(layers=2)
    watch = LoadWatch(draft)
    with watch:
        _engine_load(draft, watch.wrap(iter(sd.items())))
    left = watch.unwritten()
    assert "layers.1.qkv.weight" in left
    for model in (draft, target):  # post-load packing empties every linear weight of both models
        for layer in model.layers:
            layer.qkv.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
    assert not_provided(left, draft, shared_from=target) == left
    draft.layers[1].qkv.weight = target.layers[1].qkv.weight  # the target's own object is the target's
    assert "layers.1.qkv.weight" not in not_provided(left, draft, shared_from=target)


def test_sglangs_tied_weight_check_takes_no_two_empty_tensors_for_one():
    import torch

    from specdiff.tracer.engines.sglang.weight_facts import _same_tensor

    w = torch.ones(4, 2)
    assert _same_tensor(w, w) and not _same_tensor(w, torch.ones(4, 2))
    assert not _same_tensor(torch.empty(0), torch.empty(0))  # both pointers 0: nothing shared
