"""Pairing the two traces (pipeline stages 4-5): ``align`` pairs sequences by token content and rows
by (pos, depth); ``structure`` finds the tensors whose layouts differ; ``token_format`` says how two
sequences paired only by content were tokenized differently."""
