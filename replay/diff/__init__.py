"""specdiff.replay.diff: the diff engine — align two traces, compare them stage by stage, find the
first divergence, explain it, and render one report (text, JSON, app).

Start at ``pipeline``: ``diff_opened`` runs the stages top to bottom and builds the ``result.DiffReport``
by keyword; its docstring lists each stage and the module that computes it. The package, by stage:

- ``types`` (the pairs, comparisons, causes and the naming of the sides) and ``causes`` (every cause
  id: its kind, stages, meaning and fix) sit at the bottom: they import no stage;
- ``align/``: pair sequences and rows, find layout differences, say how token formats differ;
- ``compare/``: compare every tensor row by row (blocks, metrics, tolerance), say the first
  divergence early, read acceptance;
- ``judge/``: which failing rows count and which a legitimate difference explains (``JUDGES``);
- ``explain/``: the known mistakes that close the gap at the first divergence (``CHECKS``), the
  contract check, non-finite values, crashes and pre-flight findings;
- ``rerun/``: re-run the training draft to narrow an unexplained divergence or graft inputs;
- ``pipeline`` runs them, ``result`` holds the report, ``report`` renders it (text, JSON).

Torch-free at import (rerun/ imports the reference model lazily).
"""
