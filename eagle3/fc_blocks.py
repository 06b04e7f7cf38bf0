"""The draft's fc.weight [Hd, K*H] as K column blocks, block j multiplying aux slot j: rewriting it for
the same layers concatenated in another order (SGLang concatenates aux layers ascending,
aux_hidden_states.py; a trainer may keep the order it was given). Used by the demo's aux-order
scenario (demo/scenarios.py) and by ``specdiff fix`` (replay/fix/plan.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["reorder_fc_blocks"]


def reorder_fc_blocks(fc_weight: torch.Tensor, *, from_order, to_order) -> torch.Tensor:
    """fc.weight [Hd, K*H] trained on aux slots in ``from_order`` (HF indices, block j multiplies
    slot j) rewritten for slots in ``to_order`` (a permutation of the same layers): the result
    applied to the concat in ``to_order`` equals the input applied to the concat in ``from_order``.
    A 1-D weight [K*H] (``input_norm.weight``) is reordered the same way. Dtype kept.

    Raises ValueError when the orders are not permutations of each other or K does not divide
    the width.
    """
    from_order, to_order = [int(i) for i in from_order], [int(i) for i in to_order]
    k = len(from_order)
    if sorted(from_order) != sorted(to_order) or len(set(from_order)) != k or fc_weight.shape[-1] % k:
        raise ValueError(f"cannot reorder fc.weight {list(fc_weight.shape)} from HF {from_order} to HF {to_order}")
    blocks = fc_weight.reshape(*fc_weight.shape[:-1], k, -1)
    return blocks[..., [from_order.index(i) for i in to_order], :].reshape(fc_weight.shape).contiguous()
