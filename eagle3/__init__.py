"""specdiff.eagle3: the EAGLE-3 contract rules, each in one module, imported everywhere else.

Imports nothing else from specdiff, so the recorder (tracer), the diff engine (replay) and the
app (tui) all read the same rule. Each rule names the engine or framework source it was read from.

- ``aux_layers``: what a list of aux-layer ids means in each engine / training framework (HF
  indices, both directions) and what an engine really captures from a list of ids.
- ``families``: the target families, one row per architecture: SGLang's aux-id rule, experts or
  dense, vLLM caveats.
- ``engines``: the serving engines specdiff records (``EngineSpec``, the one registry).
- ``config_keys`` / ``config_ids``: where each engine reads the aux ids in a draft config.json, and
  which ids it takes from a given config.
- ``vocab_map``: ``d2t`` / ``t2d`` / ``hot_token_id`` semantics (offsets, how engines read them).
- ``norms``: the draft's norm flags: config keys per layout, what each computes, engine sources.
- ``acceptance``: chain acceptance per draft depth and mean accept length (SGLang's convention).
"""
