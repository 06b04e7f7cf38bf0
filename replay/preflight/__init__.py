"""Pre-flight contract check (``specdiff check``): ``check`` (the driver, ``run_preflight``),
``files`` (reading model files), ``engines`` (what each engine captures), ``rules`` (the rule
families), ``report`` (findings and the report)."""
