"""specdiff.replay.model: the EAGLE-3 reference forward (the draft as trained), the HF target's
aux-hidden-state capture, and the draft checkpoint formats (SpecForge/SGLang and speculators)."""
