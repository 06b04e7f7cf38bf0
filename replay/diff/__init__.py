"""specdiff.replay.diff: the diff engine — align two traces, compare them stage by stage, find the
first divergence, explain it, and render one report (text, JSON, app).

Start at ``pipeline``: ``diff_opened`` runs the stages top to bottom and builds the ``result.DiffReport``
by keyword; its docstring lists each stage and the module that computes it. The package, from the
bottom up (each folder imports only those above it in this list; tests/architecture/test_layering.py):

- ``types`` (the pairs, comparisons, causes, the naming of the sides and ``DiffInputs``, what the stages
  after alignment read) and ``causes`` (every cause id: its kind, stages, meaning and fix);
- ``measure/``: the per-row metrics and the tolerance every stage above measures with;
- ``align/``: pair sequences and rows, find layout differences, say how token formats differ;
- ``contract/``: the fact table, the contract check (once per diff), crashes and pre-flight findings;
- ``runner``: load the draft as trained and feed it one side's recorded inputs (the re-runs' setup);
- ``judge/``: which failing rows count and which a legitimate difference explains (``JUDGES``);
- ``compare/``: compare every tensor row by row, say the first divergence early, read acceptance;
- ``rerun/``: re-run the training draft to decide, narrow an unexplained divergence or graft inputs;
- ``explain/``: the known mistakes that close the gap at the first divergence (``CHECKS``);
- ``pipeline`` runs them, ``result`` holds the report, ``report`` renders it (text, JSON).

Torch-free at import (runner.py and rerun/ import the reference model lazily).
"""
