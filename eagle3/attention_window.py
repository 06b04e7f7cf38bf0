"""Windowed (sliding) draft attention: which earlier positions a draft layer's query may see.

A window is kept as ``W``, the largest key distance still visible (SGLang's unit), per decoder layer,
with the rule by which the distance is counted. The two rules this project meets differ at TTT depth
k >= 1:

- ``"kv"``, SGLang 0.5.23 serving: a Llama EAGLE-3 draft gets a window only from the server option
  ``--speculative-draft-window-size W``, which sets every draft layer's
  ``RadixAttention.sliding_window_size = W`` (``srt/models/llama_eagle3.py:286-299``); the draft config's
  ``layer_types`` / ``sliding_window`` are not read. The backends hide a key at KV-sequence distance
  d > W (``srt/layers/attention/torch_native_backend.py:48`` ``k_pos >= q_pos - sliding_window_size``;
  ``intel_amx_backend.py:308, :400`` pass ``W + 1`` to kernels that hide d >= W + 1). While drafting,
  that sequence is the prefix's depth-0 keys followed by the chain's draft tokens, so the query of row
  t at depth k sees prefix row s iff ``t + k - s <= W``.
- ``"prefix"``, speculators 0.9.0 training: a layer whose ``layer_types`` entry is
  ``"sliding_attention"`` attends with the config's ``sliding_window`` S
  (``models/eagle3/core.py:96-105``) through ``kv_idx > q_idx - sliding_window`` on the depth-0 block
  (``models/eagle3/attention.py:16-19``), the same block at every TTT step, the draft keys of the row's
  own diagonal always visible (``attention.py:29-33``, ``core.py:343-356``): prefix row s is visible iff
  ``t - s <= S - 1`` at every depth, so ``W = S - 1``.

A draft's own diagonal keys (depths 1..k of its row) are always visible: SGLang requires
``W >= speculative_num_draft_tokens`` (``srt/arg_groups/speculative_hook.py:427-433``).
"""

from __future__ import annotations

__all__ = ["KV", "PREFIX", "DISTANCES", "config_windows", "prefix_visible", "window_fact"]

KV, PREFIX = "kv", "prefix"
#: the distance rules (module doc)
DISTANCES = (KV, PREFIX)
SLIDING = "sliding_attention"


def config_windows(dims: dict, num_layers: int) -> tuple[int | None, ...] | None:
    """Per-layer windows ``W`` of a draft config's Llama dims (``layer_types`` with
    ``"sliding_attention"`` entries and ``sliding_window`` S, as speculators 0.9.0 reads them:
    core.py:96-105): ``S - 1`` for a sliding layer, None for a full one; None when no layer slides.

    Raises:
        ValueError: ``layer_types`` is not a list of ``num_layers`` entries, or a layer slides with no
            positive integer ``sliding_window`` (the message names the key).
    """
    types = dims.get("layer_types")
    if not types or SLIDING not in types:
        return None
    if not isinstance(types, list) or len(types) != num_layers:
        raise ValueError(f"layer_types has {len(types) if isinstance(types, list) else types!r} entries for "
                         f"num_hidden_layers {num_layers}; give one per decoder layer")
    s = dims.get("sliding_window")
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ValueError(f"sliding_window is {s!r} while layer_types names {SLIDING}; give the window as a "
                         "positive integer (keys per query, the query's own included)")
    return tuple(s - 1 if t == SLIDING else None for t in types)


def prefix_visible(T: int, depth: int, window: int | None, distance: str, device=None):
    """Which depth-0 keys each query row sees: bool [T (query row t), T (key row s)], causal and
    inside the window at TTT depth ``depth`` under rule ``distance`` (module doc); None when
    ``window`` is None (causal only, the caller's own mask)."""
    if window is None:
        return None
    import torch  # here: the CLI reads this module's rules without importing torch

    t = torch.arange(T, device=device)[:, None]
    s = torch.arange(T, device=device)[None, :]
    reach = t - s + (depth if distance == KV else 0)
    return (s <= t) & (reach <= window)


def window_fact(windows: tuple[int | None, ...] | None, distance: str, num_layers: int) -> list:
    """The contract fact ``draft_attention_window``: per decoder layer, None (full attention) or
    ``{"window": W, "distance": rule}``."""
    per = windows if windows is not None else (None,) * num_layers
    return [None if w is None else {"window": int(w), "distance": distance} for w in per]
