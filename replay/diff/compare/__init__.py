"""Comparing (pipeline stage 6-7): ``compare`` walks every tensor in dataflow order and builds its
``types.TensorComparison``; ``blocks`` compares its rows block by block on every core, with
measure/ (``metrics``; ``tolerance`` sets what counts as a difference per dtype); ``early`` says the first
divergence as soon as the rows read prove it; ``acceptance`` reads each side's accept lengths.
Which failing rows count, and which a legitimate cause explains, is decided in replay/diff/judge/."""
