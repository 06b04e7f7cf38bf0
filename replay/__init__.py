"""specdiff.replay: EAGLE-3 reference forward, replay/graft, align, compare, explain."""
