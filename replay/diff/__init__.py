"""specdiff.replay.diff: the diff engine — align two traces, compare them stage by stage, find the
first divergence, explain it, and render one report (text, JSON, app).

Start at ``pipeline``: ``diff_opened`` runs the stages top to bottom and builds the ``result.DiffReport``
by keyword; its docstring lists each stage and the module that computes it. Data flow: ``align`` ->
``structure`` / ``compare`` (``metrics``, ``tolerance``) -> ``explain`` (``contract_check``,
``findings``, ``token_format``, ``narrow``, ``graft``) -> ``acceptance`` -> ``result``; ``report``
renders it (text, JSON). Torch-free at import (graft and narrow import the reference model lazily).
"""
