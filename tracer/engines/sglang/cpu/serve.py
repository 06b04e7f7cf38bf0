"""Entry point that runs ``sglang.launch_server`` on a CPU with the AMX platform override.

Run as a script (``python <STANDIN_PATH>/serve.py <sglang server args>``) or as
``python -m specdiff.tracer.engines.sglang.cpu.serve``. It does what ``python -m sglang.launch_server`` does
(SGLang 0.5.23 ``launch_server.py``: load plugins, parse args, run, kill children), after
``claim_amx()`` (``override_platform(has_amx=True)``) in this, the launching, process only.

Why: SGLang's EAGLE draft backend table accepts only ``intel_amx`` on a CPU, while
``arg_groups/overrides.py:_attention_backend_platform_fallbacks`` rewrites ``intel_amx`` to
``torch_native`` when the platform has no AMX. Overriding the fact here keeps the backend;
the spawned scheduler still sees no AMX, so its layers use plain torch and the stand-in
``sgl_kernel`` ops. Deliberately imports nothing from specdiff, so it runs whether or not
specdiff is installed in the server's interpreter.
"""

from __future__ import annotations

import os
import sys


def claim_amx() -> str:
    """Make this process's SGLang believe the CPU has AMX; return the SGLang name that was set.

    SGLang >= 0.5.19: ``sglang.srt.runtime_context.override_platform(has_amx=True)``. Older
    releases (0.5.15.post1 checked) have no ``override_platform``; their
    ``arg_groups/overrides.py:_attention_backend_platform_fallbacks`` calls the module-level
    ``cpu_has_amx_support`` (imported from ``sglang.srt.utils``), so that name is replaced in
    that module only. Raises ImportError when neither name exists.
    """
    try:
        from sglang.srt.runtime_context import override_platform
    except ImportError:
        from sglang.srt.arg_groups import overrides

        if not hasattr(overrides, "cpu_has_amx_support"):
            raise ImportError("SGLang has neither sglang.srt.runtime_context.override_platform nor "
                              "sglang.srt.arg_groups.overrides.cpu_has_amx_support") from None
        overrides.cpu_has_amx_support = lambda: True
        return "sglang.srt.arg_groups.overrides.cpu_has_amx_support"
    override = override_platform(has_amx=True)
    override.install()
    # A forked scheduler (``fork_children``) must see the machine as a spawned one does: no AMX.
    os.register_at_fork(after_in_child=override.restore)
    return "sglang.srt.runtime_context.override_platform"


#: ``SPECDIFF_SGLANG_START=fork``: start SGLang's scheduler and detokenizer processes by fork, not by
#: the spawn SGLang 0.5.23 forces (``srt/entrypoints/engine.py:1995``). A spawned child imports torch
#: and SGLang again (~40-60 s of a CPU server's start on 2 busy cores); a forked one has them. What the
#: children compute is the same: SGLang's module-level platform facts (``_is_cpu_amx_available``) come
#: from the hardware, not from ``claim_amx``'s override, which the child drops at the fork. The tests
#: set it (tests/conftest.py ``server_env``); users get SGLang's own spawn unless they ask.
START_METHOD_ENV = "SPECDIFF_SGLANG_START"


def fork_children() -> bool:
    """Make SGLang's ``mp.set_start_method("spawn", force=True)`` select fork instead; returns False
    (and leaves spawn) where this SGLang has no ``sglang.srt.plugins._plugins_loaded`` flag.

    SGLang loads its plugins in every process it starts (0.5.23 ``srt/plugins/__init__.py:103-121``,
    once per process by that flag): specdiff's plugin arms its hooks only when loaded inside the
    scheduler (tracer/engines/sglang/plugin.py ``load``). A forked child inherits the parent's set
    flag, so the child clears it and loads the plugins itself, as a spawned one does.

    The parent loads no general plugin at all here: ``HookRegistry.apply_hooks`` patches a target
    once per process (``_patched``, srt/plugins/hook_registry.py:146-165), so a target one plugin had
    patched in the parent would be inherited as patched and the child would skip every hook another
    plugin registers on it there (specdiff's recorder on ``ModelRunner.forward`` behind a test's bug
    plugin: no trace). Plugins that act in the main process (the HTTP server, the tokenizer) are
    therefore not loaded in this mode; specdiff's and the tests' act only in the scheduler."""
    import multiprocessing as mp

    from sglang.srt import plugins

    if not hasattr(plugins, "_plugins_loaded"):
        print("specdiff: SPECDIFF_SGLANG_START=fork ignored: this SGLang has no "
              "sglang.srt.plugins._plugins_loaded; its children are spawned", file=sys.stderr)
        return False
    plugins._plugins_loaded = True  # the parent's load_plugins() calls become no-ops (docstring)
    os.register_at_fork(after_in_child=lambda: setattr(plugins, "_plugins_loaded", False))
    choose = mp.set_start_method
    mp.set_start_method = lambda method, force=False: choose("fork", force=True)
    return True


def main(argv: list[str] | None = None) -> None:
    """Override ``has_amx``, then launch the SGLang HTTP server with ``argv`` (sglang flags)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        claim_amx()
    except ImportError as exc:
        import sglang

        sys.exit(f"specdiff: error: cannot run SGLang {getattr(sglang, '__version__', '?')} on a CPU "
                 f"without AMX: {exc} (README: SGLang compatibility)")

    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    if os.environ.get(START_METHOD_ENV) == "fork":
        fork_children()
    load_plugins()
    server_args = prepare_server_args(argv)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
