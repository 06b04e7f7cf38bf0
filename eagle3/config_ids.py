"""Which aux ids an engine (and model runner) takes from a draft config.json, from which key, and
which keys holding ids it leaves unread: the one rule ``specdiff check``, ``record train`` and the
diff's explanations share (the keys and their precedence: ``config_keys``); and which engines a
draft config is written for (``draft_engines``: the keys it carries), whose verdict ``check`` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdiff.eagle3.aux_layers import ConventionError
from specdiff.eagle3.config_keys import (
    ENGINE_FALLBACK,
    ENGINE_ID_KEYS,
    ENGINE_ID_SOURCES,
    ENGINE_RUNNERS,
    ID_KEYS,
    KEY_DFLASH,
    KEY_DFLASH_LAYERS,
    KEY_DSPARK,
    KEY_EAGLE_LAYERS,
    KEY_NESTED,
    KEY_TARGET_IDS,
    KEY_TOP,
    PLUS_ONE_KEYS,
    config_value,
)
from specdiff.eagle3.engines import ENGINES, REGISTRY, engine_spec


@dataclass(frozen=True)
class ConfigIds:
    """The aux ids one engine (and model runner) takes from a draft config.json, and from where.

    Attributes:
        engine: 'sglang' or 'vllm'.
        runner: the model runner whose precedence was applied ('v1', 'v2'; None for SGLang).
        ids: the ids the engine uses, in its own numbering (DFlash's +1 applied); None: no key it
            reads held ids, so it captures its default layers.
        key: the ``ID_KEYS`` entry they came from; None for the default fallback.
        unread: (key, ids as written) for every other ``ID_KEYS`` key holding ids: ignored by this
            runner or shadowed by a key it reads first.
        sources: where the precedence was read (``ENGINE_ID_SOURCES``).
    """

    engine: str
    runner: str | None
    ids: tuple[int, ...] | None
    key: str | None
    unread: tuple[tuple[str, tuple], ...] = ()
    sources: str = ""

    @property
    def who(self) -> str:
        """'SGLang', 'vLLM V1', 'vLLM V2'."""
        title = engine_spec(self.engine).title
        return f"{title} {self.runner.upper()}" if self.runner else title

    @property
    def fallback(self) -> str:
        """What this engine does without ids, in words with its source."""
        return ENGINE_FALLBACK[(self.engine, self.runner)]

    def read_by(self, key: str) -> bool:
        """Whether this engine/runner reads ``key`` at all."""
        return key in ENGINE_ID_KEYS[(self.engine, self.runner)]


def _id_list(key: str, v) -> tuple | None:
    """``v`` as a tuple of ints when it is a non-empty list; None when absent or empty.

    Raises:
        ConventionError: a list holding anything but ints.
    """
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ConventionError(f"draft config: {key} {v!r} is not a list of ints")
    return tuple(v)


def config_aux_ids(engine: str, raw: dict, *, runner: str | None = None) -> ConfigIds:
    """Which aux ids ``engine`` takes from the draft's config.json ``raw`` (``ENGINE_ID_KEYS``).

    Args:
        engine: one of ``ENGINES``.
        raw: the draft's config.json as a dict.
        runner: vLLM's model runner, 'v1' or 'v2' (None: the first of ``ENGINE_RUNNERS``, the one
            specdiff's recorder runs on); must be None for SGLang.

    Returns:
        ConfigIds. SGLang uses ``eagle_config.eagle_aux_hidden_state_layer_ids`` as given, an empty
        list included (it then captures nothing); vLLM treats an empty list as no ids.

    Raises:
        ConventionError: unknown engine or runner, or ids that are not a list of ints.
    """
    if engine not in ENGINE_RUNNERS:
        raise ConventionError(f"unknown engine {engine!r}; use one of: {', '.join(ENGINES)}")
    runner = ENGINE_RUNNERS[engine][0] if runner is None else runner
    if runner not in ENGINE_RUNNERS[engine]:
        raise ConventionError(f"{engine} has no model runner {runner!r}; use one of: "
                              f"{', '.join(str(r) for r in ENGINE_RUNNERS[engine])}")
    vals = {k: _id_list(k, config_value(raw, k)) for k in ID_KEYS}
    ids, key = None, None
    if engine == "sglang":
        eagle = raw.get("eagle_config")
        if isinstance(eagle, dict) and vals[KEY_NESTED] is not None:
            ids, key = vals[KEY_NESTED], KEY_NESTED
    elif vals[KEY_TOP]:
        ids, key = vals[KEY_TOP], KEY_TOP
    elif runner == "v1":
        if isinstance(raw.get("dflash_config"), dict) and raw["dflash_config"] and vals[KEY_DFLASH]:
            ids, key = tuple(i + 1 for i in vals[KEY_DFLASH]), KEY_DFLASH
        if isinstance(raw.get("eagle_config"), dict) and raw["eagle_config"]:
            # gpu_model_runner.py:5279-5280: a non-empty eagle_config replaces whatever dflash gave
            ids, key = (vals[KEY_NESTED], KEY_NESTED) if vals[KEY_NESTED] else (None, None)
    else:
        for k in (KEY_DFLASH, KEY_DSPARK, KEY_TARGET_IDS, KEY_DFLASH_LAYERS, KEY_EAGLE_LAYERS):
            if vals[k]:
                # eagle3_utils.py:115-122: DeepSeek v4.1 reads its dspark ids as they are
                literal = k == KEY_DSPARK and raw.get("model_type") == "deepseek_v41"
                ids, key = (vals[k] if k not in PLUS_ONE_KEYS or literal else tuple(i + 1 for i in vals[k])), k
                break
    unread = tuple((k, v) for k, v in vals.items() if v and k != key)
    return ConfigIds(engine, runner, ids, key, unread, ENGINE_ID_SOURCES[(engine, runner)])


@dataclass(frozen=True)
class DraftEngines:
    """The engines a draft checkpoint is written for, read from its format and the keys its config
    carries (``draft_engines``).

    Attributes:
        engines: engine names, in ``ENGINES`` order (never empty).
        why: one line saying what in the checkpoint says so.
    """

    engines: tuple[str, ...]
    why: str


def _carries(raw: dict, key: str) -> bool:
    """Whether ``key`` holds something in the config (a non-empty value of any type: a malformed
    value still says which engine the author wrote for; ``config_aux_ids`` reports the malformation)."""
    v = config_value(raw, key)
    return v is not None and v != [] and v != ()


def draft_engines(raw: dict, fmt: str | None) -> DraftEngines:
    """The engines a draft config.json ``raw`` of checkpoint layout ``fmt`` is written for.

    In order: only the engines with a model class for the layout (``EngineSpec.checkpoint_formats``;
    a speculators checkpoint is vLLM's); of those, the ones whose own aux-id key
    (``EngineSpec.aux_ids_key``: SGLang ``eagle_config``'s ids, vLLM the top-level ones) holds ids;
    else the ones that read some other key holding ids (``dflash_config``'s: vLLM); else every
    engine that loads it (no ids: each captures its default layers). ``fmt`` None (not an EAGLE-3
    checkpoint): every engine.
    """
    title = {n: s.title for n, s in REGISTRY.items()}
    if fmt is None:
        return DraftEngines(ENGINES, "not an EAGLE-3 checkpoint: judged for every engine")
    loaders = tuple(e for e in ENGINES if fmt in REGISTRY[e].checkpoint_formats)
    if not loaders:
        return DraftEngines(ENGINES, f"{fmt} layout: no engine specdiff knows loads it; judged for every engine")
    only = (f"{fmt} layout, which only {' and '.join(title[e] for e in loaders)} has a model class for"
            if len(loaders) < len(ENGINES) else "")
    own = tuple(e for e in loaders if _carries(raw, REGISTRY[e].aux_ids_key))
    other = [k for k in ID_KEYS if _carries(raw, k)]
    readers = tuple(e for e in loaders if other and any(
        other[0] in ENGINE_ID_KEYS[(e, r)] for r in ENGINE_RUNNERS[e]))
    if own:
        why = "its aux ids are in " + "; ".join(f"{REGISTRY[e].aux_ids_key}, the key {title[e]} reads" for e in own)
    elif readers:
        why = f"its aux ids are in {other[0]}, which only {' and '.join(title[e] for e in readers)} reads"
    else:
        why = "" if only else "no aux ids in its config: every engine captures its default layers"
    return DraftEngines(own or readers or loaders, "; ".join(w for w in (only, why) if w))
