"""Re-running the training draft (pipeline stages 7 and 12, and ``diff --graft``) on the setup of
replay/diff/runner.py: ``reexec`` decides whether a draft stage is the first divergence; ``narrow`` re-runs
the draft on serving's inputs to say whether the draft or its inputs make an unexplained divergence
(``id_ties``: a top-k set equal up to the logits' noise); ``graft`` substitutes one input at a time and
measures the acceptance each one costs. Torch is imported lazily, when a re-run is asked for."""
