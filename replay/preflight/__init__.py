"""specdiff.replay.preflight: the pre-flight contract check (``specdiff check``), from files only."""
