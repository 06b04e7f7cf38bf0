"""The weight files of a draft checkpoint directory, read without torch: which files hold the
weights, every tensor's shape and dtype (safetensors headers), the small vocab-map tensors as numpy,
the names as SGLang loads them and the shapes a config implies.

``specdiff check`` reads a draft through this module alone (replay/preflight/files.py), so the
pre-flight never imports torch for a safetensors checkpoint; ``replay.model.checkpoint`` (which
builds the torch model) uses the same names, shapes and file rules. torch is imported only where it
is the reader: a ``.bin`` checkpoint (``torch.load(weights_only=True)``: no pickle code runs), and a
loaded tensor in a dtype numpy has no type for (bf16, fp8: a floating ``d2t``, read as float32).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from specdiff.eagle3.vocab_map import as_array
from specdiff.replay.model.draft_config import CheckpointError

if TYPE_CHECKING:
    from specdiff.replay.model.draft_config import Eagle3DraftConfig

__all__ = ["IGNORED_KEYS", "OPTIONAL_SHAPES", "canonical_name", "expected_shapes", "ignored_key", "later_input_norm_aliases", "later_input_norm_note", "layer_keys", "load_bin", "read_weight_headers",
           "unreadable", "weight_files"]

#: keys speculators writes or keeps that the draft forward does not use (engines skip them too)
IGNORED_KEYS = ("verifier_norm.weight", "verifier_lm_head.weight")
#: ``layers.{i}.input_layernorm.weight`` of a layer i >= 1: SGLang 0.5.23 loads it into a module its
#: forward never calls (a later layer normalises its input with ``hidden_norm``, llama_eagle3.py:103-105)
_LATER_INPUT_NORM = re.compile(r"^(model\.)?layers\.([1-9][0-9]*)\.input_layernorm\.weight$")
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32",
              "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
#: safetensors dtypes numpy has no type for (safetensors' numpy reader raises on them)
_NOT_NUMPY = ("BF16", "F8_E4M3", "F8_E5M2")
_LEGACY = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}


# ---- files ------------------------------------------------------------------------------
def weight_files(path: Path) -> tuple[str, list[Path]]:
    """(``"safetensors"`` or ``"bin"``, the files, sorted) of a checkpoint directory: every
    ``*.safetensors``, else every ``*.bin``. Raises CheckpointError when there is neither."""
    st = sorted(path.glob("*.safetensors"))
    if st:
        return "safetensors", st
    bins = sorted(path.glob("*.bin"))
    if not bins:
        raise CheckpointError(f"draft {path}: no *.safetensors or *.bin weights found")
    return "bin", bins


def load_bin(f: Path, *, mmap: bool = False) -> dict:
    """The torch tensors of one ``.bin`` file, ``weights_only=True`` (no pickle code runs).
    Raises CheckpointError naming the file when it cannot be read that way."""
    import torch  # a .bin file is a torch pickle: nothing else reads it

    try:
        return torch.load(str(f), map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # pickle with code, truncated file
        raise CheckpointError(f"draft weights {f}: unreadable (weights_only=True: {type(e).__name__}: {e})") from None


def unreadable(f: Path, e: Exception) -> CheckpointError:
    """The error for a safetensors file that cannot be read (corrupt header, truncated)."""
    return CheckpointError(f"draft weights {f}: unreadable safetensors ({type(e).__name__}: {e})")


def _st_tensor(sf, f: Path, name: str, dtype: str) -> np.ndarray:
    """One tensor of an open safetensors file (``safe_open(framework="numpy")``) as numpy."""
    if dtype not in _NOT_NUMPY:
        return sf.get_tensor(name)
    from safetensors import safe_open  # the torch reader: only it has these dtypes

    with safe_open(str(f), framework="pt") as pt:
        return as_array(pt.get_tensor(name))


def read_weight_headers(path: str | Path, *, load=("d2t", "t2d")) -> tuple[dict, dict[str, np.ndarray]]:
    """Shapes and dtypes of every tensor of a checkpoint directory without loading the weights
    (safetensors headers; ``.bin`` memory-mapped with ``weights_only=True``), plus the tensors
    whose ``canonical_name`` is in ``load`` (by default the small ``d2t`` / ``t2d``) as numpy arrays
    (their own dtype; floats narrower than float32 as float32).

    Returns:
        ({file tensor name: (shape tuple, dtype name e.g. 'bfloat16')}, {canonical name: array}).

    Raises:
        CheckpointError: no weights, or an unreadable file (named).
    """
    path = Path(path)
    kind, files = weight_files(path)
    meta: dict[str, tuple[tuple[int, ...], str]] = {}
    loaded: dict[str, np.ndarray] = {}
    for f in files:
        if kind == "bin":
            for name, t in load_bin(f, mmap=True).items():
                meta[name] = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
                if canonical_name(name) in load:
                    loaded[canonical_name(name)] = as_array(t).copy()
            continue
        from safetensors import safe_open
        try:
            with safe_open(str(f), framework="numpy") as sf:
                for name in sf.keys():
                    sl = sf.get_slice(name)
                    meta[name] = (tuple(sl.get_shape()), _ST_DTYPES.get(sl.get_dtype(), sl.get_dtype().lower()))
                    if canonical_name(name) in load:
                        loaded[canonical_name(name)] = _st_tensor(sf, f, name, sl.get_dtype())
        except Exception as e:  # corrupt header, truncated file
            raise unreadable(f, e) from None
    return meta, loaded


# ---- names and shapes -------------------------------------------------------------------
def canonical_name(name: str) -> str:
    """A weight name as SGLang loads it: no ``model.`` prefix, legacy ``aux_norm_*`` ->
    ``fc_norm.{j}``, speculators ``layers.0.`` -> ``midlayer.`` (llama_eagle3.py:337-348)."""
    if name.startswith("model."):
        name = name[len("model."):]
    for old, new in _LEGACY.items():
        name = name.replace(old, new)
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def ignored_key(name: str) -> bool:
    """True for a file key no engine computes with: speculators' ``verifier_*``, a rope table, and
    ``layers.{i}.input_layernorm.weight`` of a layer i >= 1 (SGLang 0.5.23 llama_eagle3.py:103-105
    normalises a later layer's input with its ``hidden_norm``; the loaded input_layernorm is unused)."""
    return name in IGNORED_KEYS or name.endswith("rotary_emb.inv_freq") or bool(_LATER_INPUT_NORM.match(name))


def later_input_norm_aliases(names) -> dict[str, str]:
    """File key -> canonical ``layers.{i}.hidden_norm.weight`` for each later layer i >= 1 whose file names its
    input norm ``input_layernorm`` only (no ``hidden_norm``): a speculators-format draft. speculators 0.9.0
    builds a later layer as a plain decoder layer normalising its input with ``input_layernorm``
    (models/eagle3/core.py:81-94) and vLLM 0.32.0 reads it there (llama_eagle3.py:136-138), the role
    ``hidden_norm`` plays in SGLang 0.5.23 (llama_eagle3.py:103-105), which then serves the norm as built.

    Args:
        names: the checkpoint's tensor names (any iterable of str).
    """
    names = set(names)
    out = {}
    for name in names:
        m = _LATER_INPUT_NORM.match(name)
        if m and f"{m.group(1) or ''}layers.{m.group(2)}.hidden_norm.weight" not in names:
            out[name] = f"layers.{m.group(2)}.hidden_norm.weight"
    return out


def later_input_norm_note(file_key: str, canon: str) -> str:
    """The note a checkpoint's loading keeps for ``later_input_norm_aliases``' reading of ``file_key``."""
    i = canon.split(".")[1]
    return (f"{file_key} read as layer {i}'s input norm: the file has no layers.{i}.hidden_norm (speculators 0.9.0's "
            "later layers normalise with input_layernorm, models/eagle3/core.py:81-94, as vLLM 0.32.0 reads it, "
            f"llama_eagle3.py:136-138; SGLang 0.5.23 reads hidden_norm, llama_eagle3.py:103-105, and serves it as built)")


def layer_keys(i: int, cfg: Eagle3DraftConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape of decoder layer ``i``'s weights.

    Layer 0 (``midlayer.*``; SGLang's ``layers.0``) attends over ``cat(embeds, hidden)`` [2*Hd] and
    has ``input_layernorm`` for the embedding; a layer i >= 1 (``layers.{i}.*``, the name SGLang
    0.5.23 loads, llama_eagle3.py:372) attends over Hd and normalises its input with
    ``hidden_norm`` (``is_input_layer``, llama_eagle3.py:63-64, :97-105).
    """
    Hd, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    p, width = ("midlayer.", 2 * Hd) if i == 0 else (f"layers.{i}.", Hd)
    keys = {
        f"{p}self_attn.q_proj.weight": (nh * hd, width),
        f"{p}self_attn.k_proj.weight": (nkv * hd, width),
        f"{p}self_attn.v_proj.weight": (nkv * hd, width),
        f"{p}self_attn.o_proj.weight": (Hd, nh * hd),
        f"{p}mlp.gate_proj.weight": (I, Hd),
        f"{p}mlp.up_proj.weight": (I, Hd),
        f"{p}mlp.down_proj.weight": (Hd, I),
    }
    if i == 0:
        keys[f"{p}input_layernorm.weight"] = (Hd,)
    keys[f"{p}hidden_norm.weight"] = (Hd,)
    keys[f"{p}post_attention_layernorm.weight"] = (Hd,)
    return keys


def expected_shapes(cfg: Eagle3DraftConfig) -> dict[str, tuple[int, ...]]:
    """Canonical weight name -> shape every draft with ``cfg`` must have: fc, each of the
    ``num_hidden_layers`` decoder layers (``layer_keys``), norm, lm_head (the optional ones,
    embedding and vocab map, are in ``OPTIONAL_SHAPES``)."""
    Hd = cfg.hidden_size
    shapes = {"fc.weight": (Hd, cfg.aux_width)}
    for i in range(cfg.num_hidden_layers):
        shapes.update(layer_keys(i, cfg))
    shapes.update({"norm.weight": (Hd,), "lm_head.weight": (cfg.draft_vocab_size, Hd)})
    if cfg.norm_before_fc:
        shapes["input_norm.weight"] = (cfg.aux_width,)
    if cfg.fc_norm:
        for j in range(cfg.num_aux):
            shapes[f"fc_norm.{j}.weight"] = (cfg.target_hidden_size,)
    return shapes


#: canonical name -> shape (from the config) of the weights a checkpoint may omit
OPTIONAL_SHAPES = {"embed_tokens.weight": lambda c: (c.vocab_size, c.hidden_size),
                    "d2t": lambda c: (c.draft_vocab_size,), "t2d": lambda c: (c.vocab_size,)}
