"""specdiff.replay.diff: the diff engine — align two traces, compare them stage by stage, find the
first divergence, explain it, and render one report (text, JSON, app).

Data flow: ``align`` -> ``structure`` / ``compare`` (``metrics``, ``tolerance``) -> ``explain``
(``contract_check``, ``findings``, ``token_format``, ``narrow``, ``graft``) -> ``acceptance`` ->
``report``. Torch-free at import (graft and narrow import the reference model lazily).
"""
