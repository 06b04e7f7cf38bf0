"""specdiff's vLLM recorder (vLLM 0.32, V1 runner on the CPU build; V2 names declared for GPU)."""
