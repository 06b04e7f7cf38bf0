"""specdiff.replay.record: the training-side recorder (``specdiff record train``): teacher-forced
EAGLE-3 TTT forward over token sequences, written as a trace."""
