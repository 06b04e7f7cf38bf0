"""Re-running the training draft (pipeline stage 12 and ``diff --graft``): ``rerun`` loads the draft
and feeds it one side's recorded inputs; ``narrow`` re-runs it on serving's inputs to say whether the
draft or its inputs make an unexplained divergence; ``graft`` substitutes one input at a time and
measures the acceptance each one costs. Torch is imported lazily, when a re-run is asked for."""
