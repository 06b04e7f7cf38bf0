"""rope_theta / rope_scaling as a draft or target config.json names them (transformers 4's flat keys
or transformers 5's ``rope_parameters``), shared by the draft config reader and the pre-flight."""

from __future__ import annotations

__all__ = ["LLAMA_DEFAULT", "rope_params"]

#: where a value absent from a draft config comes from
LLAMA_DEFAULT = "transformers LlamaConfig default (SGLang builds the draft's config with it)"


def rope_params(d: dict, default=None) -> tuple[float, dict | None]:
    """rope_theta / rope_scaling of a LlamaConfig dict (transformers 5 ``rope_parameters`` too);
    an absent one takes transformers' value (10000, plain rope) through ``default(name, value,
    why)`` when given (which records it)."""
    if default is None:
        def default(_name, value, _why):
            return value
    rp = d.get("rope_parameters") or {}
    if d.get("rope_theta") is not None:
        theta = d["rope_theta"]
    elif rp.get("rope_theta") is not None:
        theta = rp["rope_theta"]
    else:
        theta = default("rope_theta", 10000.0, LLAMA_DEFAULT)
    if "rope_scaling" in d:
        scaling = d["rope_scaling"]
    elif rp:
        scaling = dict(rp) if rp.get("rope_type", "default") != "default" else None
    else:
        scaling = default("rope_scaling", None, f"plain rope ({LLAMA_DEFAULT})")
    try:
        theta = float(theta)
    except (TypeError, ValueError):
        pass  # Eagle3DraftConfig refuses it, naming the field
    return theta, scaling
