"""``specdiff fix``: from a diff report's first divergence and its cause, the corrected copy of the
served draft.

- plan.py: cause -> ``FixPlan`` (config keys and tensors to change, each with its new value) or a
  one-line refusal (``NoMechanicalFix``) where no mechanical fix exists;
- write.py: writes the plan as a copy of the served draft directory (never in place) and renders
  the change as a diff of config keys and tensor names (text or JSON).

The EAGLE-3 knowledge each fix uses lives where the diff keeps it: the aux-id rules
(replay/diff/explain/aux.py ``aux_fix``), the norm flags' keys (eagle3/norms.py), the vocab map
(eagle3/vocab_map.py) and the fc column blocks (eagle3/fc_blocks.py).
"""

from specdiff.replay.fix.plan import ConfigEdit, FixPlan, NoMechanicalFix, TensorEdit, plan_fix

__all__ = ["ConfigEdit", "FixPlan", "NoMechanicalFix", "TensorEdit", "plan_fix"]
