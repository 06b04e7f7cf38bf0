"""Measuring (the floor the stages above read): ``metrics`` are the per-row error measures (relative
error, cosine, top-k overlap) and ``tolerance`` sets what counts as a difference per dtype and preset.
The judges, compare/, rerun/ and explain/ all read them; they import no stage."""
