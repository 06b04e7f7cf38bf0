"""specdiff.demo_models: builds the demo's tiny target/draft pair offline (not product code).

``python -m specdiff.demo_models.tiny_models --out traces/models``. Product modules (tracer,
replay, tui, eagle3) never import this package; tests and the model build do.
"""
