"""``record train --target-backend sglang``: the target forward in SGLang's own engine, with the user's
parallel settings, as the training side's target (a target too large for one device).

How the layers are captured: SGLang 0.5.23's capture-only mode (``--enable-return-aux-hidden-states
--speculative-algorithm EAGLE3 --return-aux-hidden-state-layer-ids IDS``: srt/arg_groups/validation_hook.py:697-751,
srt/model_executor/model_runner_components/spec_aux_hidden_state.py:90-110) hands the ids to the target model's
own ``set_eagle3_layers_to_capture`` (model_runner_components/attention_backend_setup.py:54-61), the method
SpecForge 0.2.0's offline capture calls (specforge/offline_capture/sglang_backend/capture.py:86-87); a request
with ``return_hidden_states`` then receives every prompt token's aux hidden states concatenated in the model's
capture order (srt/layers/logits_processor.py:866-869, ``pack_aux_hidden_states``; rows appended by
srt/managers/scheduler_components/batch_result_processor.py:657-659). SpecForge's own backend builds its
``ModelRunner`` on ``torch.cuda.current_device()`` (capture.py:66) inside SpecForge's torch.distributed groups
(capture.py:49, :61), so it cannot run on the CPU; the same capture is reached here through a server the
project's launcher starts (tracer/engines/sglang/cpu/launch.py ``ServerProcess``: the CPU recipe on ``cpu``,
SGLang's ``launch_server`` on ``cuda``), with ``--tp-size`` and the user's other engine arguments passed as given.
SGLang's offline ``sglang.Engine`` runs on the CPU recipe too (measured 2026-12-06: capture-only mode up in 168 s
on 2 shared cores, 5 x 768 aux rows for a 5-token prompt of the demo target), but only with the stand-in
``sgl_kernel`` first on this process's import path and the AMX override installed in it before SGLang is imported
(tracer/engines/sglang/cpu/serve.py ``claim_amx``), process-wide changes the launcher keeps inside the server's
process; ``launch_server`` runs that same Engine behind HTTP, so the computation is the engine's either way.

What an SGLang id captures depends on the target's model file (eagle3/aux_layers.py's rules): the ids sent are
``eagle3.aux_layers.native_aux_ids`` of the training HF indices under the target's SGLang family rule, and what
SGLang captures for them is predicted by ``engine_capture``; both go into the contract (``engine_target``). The
engine returns the captured slots in ascending HF order (its layer loop); they are put back into training's
concat order here.

The final hidden state is not in SGLang's response (``last_hidden_states`` is kept for in-process consumers
only, logits_processor.py:233-236), so ``target.argmax`` is the engine's own greedy token at each position from
its top-1 input / output logprobs (``return_logprob``, ``logprob_start_len 0``), and ``target.logits_topk.*``
(logit values SGLang does not return) are not recorded.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

import numpy as np
import torch

from specdiff.eagle3.aux_layers import ConventionError, engine_capture, native_aux_ids, target_architecture
from specdiff.eagle3.families import sglang_family_rule
from specdiff.replay.model.target_capture import TargetCapture
from specdiff.replay.model.target_head import TargetHead
from specdiff.replay.trainers.errors import RecordTrainError

__all__ = ["EngineSettings", "SGLangTarget", "sglang_capture_ids"]

#: what the capture server gets besides the user's arguments: every prompt token computed (a radix-cache hit
#: returns no hidden states for the cached prefix) and SGLang's capture-only mode
CAPTURE_ARGS = ("--disable-radix-cache", "--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3")


@dataclass(frozen=True)
class EngineSettings:
    """The engine's settings as the user gave them.

    Attributes:
        tp_size: ``--tp-size`` (None: not given, SGLang's own default).
        engine_args: more SGLang server arguments, ``shlex``-split, passed as given (``--ep-size 2 ...``).
        device: ``cpu`` (the project's CPU recipe) or ``cuda`` (SGLang's launch_server).
    """

    tp_size: int | None = None
    engine_args: tuple[str, ...] = ()
    device: str = "cpu"

    @classmethod
    def parse(cls, *, tp_size: int | None, engine_args: str | None, device: str) -> EngineSettings:
        """Settings from the command line's strings.

        Raises:
            RecordTrainError: ``--engine-args`` cannot be split, or repeats an argument specdiff sets itself.
        """
        try:
            args = tuple(shlex.split(engine_args or ""))
        except ValueError as e:
            raise RecordTrainError(f"--engine-args {engine_args!r}: {e}") from None
        owned = {"--model-path", "--return-aux-hidden-state-layer-ids", "--dtype", "--tp-size", *CAPTURE_ARGS}
        clash = [a for a in args if a.split("=")[0] in owned]
        if clash:
            raise RecordTrainError(f"--engine-args {engine_args!r}: {clash[0].split('=')[0]} is set by record train (--target, "
                                   "--aux-layers, --target-dtype, --tp-size or the capture itself); leave it out")
        dev = torch.device(device).type
        if dev not in ("cpu", "cuda"):
            raise RecordTrainError(f"--device {device}: --target-backend sglang runs SGLang on cpu or cuda")
        return cls(tp_size, args, dev)

    def server_args(self) -> list[str]:
        """The user's parallel settings and engine arguments, as given."""
        return [*(["--tp-size", str(self.tp_size)] if self.tp_size is not None else []), *self.engine_args]


def sglang_capture_ids(hf_indices, *, num_layers: int, architecture: str | None) -> tuple[list[int], list[int]]:
    """The SGLang ids that capture the training HF indices on this target, and the permutation that puts the
    engine's slots (ascending HF) into training's concat order: slot j of training = engine slot ``order[j]``.

    Raises:
        RecordTrainError: an index SGLang's capture-only mode cannot return: the embedding output (its id -1 is
            refused, ``--return-aux-hidden-state-layer-ids must be non-negative``, validation_hook.py:738-742),
            one the family rule never captures, or one the predicted capture does not reach.
    """
    hf = [int(h) for h in hf_indices]
    try:
        ids = native_aux_ids(hf, "sglang", num_layers=num_layers, architecture=architecture)
    except ConventionError as e:
        raise RecordTrainError(f"--target-backend sglang: training layers HF {hf}: {e}") from None
    if any(i < 0 for i in ids):
        raise RecordTrainError(f"--target-backend sglang: training layers HF {hf} need SGLang ids {ids}, and SGLang "
                               "0.5.23's capture-only mode refuses a negative id (the embedding output): record this "
                               "draft with --target-backend transformers")
    plan = engine_capture("sglang", ids, num_layers=num_layers, architecture=architecture)
    if sorted(hf) != list(plan.hf_indices) or plan.dropped or plan.prenorm:
        raise RecordTrainError(f"--target-backend sglang: SGLang ids {ids} capture HF {list(plan.hf_indices)} on "
                               f"{architecture}, not the training layers HF {hf}"
                               + (f" ({plan.failure})" if plan.failure else ""))
    return ids, [sorted(hf).index(h) for h in hf]


def _argmax(meta: dict, n: int) -> np.ndarray:
    """The engine's greedy token at positions 0..n-1 (position t predicts token t+1): top-1 of
    ``input_top_logprobs[t + 1]``, and of ``output_top_logprobs[0]`` for the last position."""
    tops = list(meta.get("input_top_logprobs") or [])[1:n] + list(meta.get("output_top_logprobs") or [])[:1]
    if len(tops) != n or any(not t for t in tops):
        raise RecordTrainError(f"SGLang returned top logprobs for {len(tops)} of {n} positions")
    return np.asarray([int(t[0][1]) for t in tops], np.int64)


class SGLangTarget(torch.nn.Module):
    """The target in SGLang's engine, as ``TrainReplayer``'s target (``capture_batch``, as
    replay/record/feature_target.py's ``FeatureTarget``): the head (config, embedding, lm_head) is read from the
    target's files for the draft; the forward runs in the server.

    Attributes:
        head: the target's ``TargetHead``; settings: ``EngineSettings``; dtype: the SGLang ``--dtype`` name.
        ids / order: ``sglang_capture_ids`` (set by ``start``); server: the running ``ServerProcess`` or None.
    """

    def __init__(self, head: TargetHead, target_dir, settings: EngineSettings, *, dtype: str, log_path=None):
        super().__init__()
        self.head, self.target_dir, self.settings, self.dtype = head, str(target_dir), settings, dtype
        self.log_path = log_path
        self.config = head.config
        self.ids: list[int] = []
        self.order: list[int] = []
        self.server = None
        self.specdiff_missing_keys: list[str] = []

    def get_input_embeddings(self):
        return self.head.get_input_embeddings()

    def get_output_embeddings(self):
        return self.head.get_output_embeddings()

    def facts(self, hf_indices) -> dict:
        """The contract's ``engine_target``: the engine, what it was given and what its ids capture."""
        fam = sglang_family_rule(target_architecture(self.config.to_dict()))
        return {"engine": "sglang", "device": self.settings.device, "dtype": self.dtype,
                "server_args": self.settings.server_args(), "capture_ids": list(self.ids),
                "capture_hf_indices": sorted(int(h) for h in hf_indices), "concat_order_from_engine": list(self.order),
                "ids_source": f"the training layers (aux_concat_order) in SGLang's {fam.name} rule for "
                              f"{target_architecture(self.config.to_dict())} ({'; '.join(fam.sources)}), passed to the "
                              "model's set_eagle3_layers_to_capture by --return-aux-hidden-state-layer-ids "
                              "(model_runner_components/attention_backend_setup.py:61)",
                "argmax_source": "top-1 input/output logprob of the engine", "logits_topk": "not returned by SGLang"}

    def start(self, hf_indices) -> None:
        """Start the capture server for the training layers ``hf_indices`` (once).

        Raises:
            RecordTrainError: the layers cannot be captured (``sglang_capture_ids``) or the server does not start.
        """
        from specdiff.tracer.engines.base import cpu_launcher
        from specdiff.tracer.engines.server import ServerError

        L = int(self.config.get_text_config().num_hidden_layers)
        self.ids, self.order = sglang_capture_ids(hf_indices, num_layers=L,
                                                  architecture=target_architecture(self.config.to_dict()))
        args = ["--dtype", self.dtype, *CAPTURE_ARGS, "--return-aux-hidden-state-layer-ids",
                *map(str, self.ids), *self.settings.server_args()]
        env = {k: v for k, v in os.environ.items() if k != "SPECDIFF_TRACE"}  # the capture server is not traced
        # the engine's launcher by name (tests/architecture: replay reaches an engine through the boundary only);
        # its ServerProcess runs the CPU recipe on cpu and SGLang's own launch_server on cuda
        self.server = cpu_launcher("sglang").ServerProcess(self.target_dir, extra_args=args, env=env, device=self.settings.device,
                                    log_path=self.log_path)
        try:
            self.server.start()
        except ServerError as e:
            raise RecordTrainError(f"--target-backend sglang: {e}") from None

    def close(self) -> None:
        """Stop the server (no-op when none runs)."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def capture_one(self, tokens) -> tuple[torch.Tensor, np.ndarray]:
        """One sequence's aux hidden states [T, K*H] (the engine's dtype as returned, float32 values of it) in the
        engine's slot order, and its greedy tokens [T] int64.

        Raises:
            RecordTrainError: the response lacks the hidden states or holds another number of rows.
        """
        n = len(tokens)
        got = self.server.post("/generate", {
            "input_ids": [int(t) for t in tokens], "return_hidden_states": True, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": 1,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
        meta = got.get("meta_info", {}) if isinstance(got, dict) else {}
        hs = meta.get("hidden_states") or []
        rows = torch.tensor(hs[0], dtype=torch.float32) if hs else None
        if rows is None or rows.ndim != 2 or rows.shape[0] != n:
            raise RecordTrainError(f"SGLang returned {None if rows is None else tuple(rows.shape)} hidden-state rows "
                                   f"for a {n}-token prefill (expected {n} x K*H)")
        return rows, _argmax(meta, n)

    @torch.no_grad()
    def capture_batch(self, input_ids: torch.Tensor, lengths: torch.Tensor, seqs, *, hf_indices, prenorm=(),
                      top_logits: int = 0) -> TargetCapture:
        """The batch's ``TargetCapture`` (right-padded to ``input_ids`` [B, T]) from the engine: aux slots in
        training's order, in the target dtype; ``logits_top`` None (module doc).

        Raises:
            RecordTrainError: a pre-norm slot (not capturable here), or a response as ``capture_one``.
        """
        if prenorm:
            raise RecordTrainError("--target-backend sglang cannot return a pre-norm slot; use transformers")
        if self.server is None:
            self.start(hf_indices)
        B, T = input_ids.shape
        H, K = int(self.config.get_text_config().hidden_size), len(self.order)
        dt = getattr(torch, self.dtype)
        aux_cat = torch.zeros(B, T, K * H, dtype=dt)
        argmax = torch.zeros(B, T, dtype=torch.int64)
        for b in range(B):
            n = int(lengths[b])
            rows, am = self.capture_one(input_ids[b, :n].tolist())
            if rows.shape[1] != K * H:
                raise RecordTrainError(f"SGLang returned {rows.shape[1]} aux features a token, expected {K} x {H}")
            slots = rows.unflatten(1, (K, H))[:, self.order]
            aux_cat[b, :n] = slots.flatten(1).to(dt)
            argmax[b, :n] = torch.from_numpy(am)
        aux = [aux_cat[..., j * H:(j + 1) * H] for j in range(K)]
        return TargetCapture(input_ids=input_ids, lengths=lengths, hf_indices=tuple(hf_indices), aux=aux,
                             aux_cat=aux_cat, argmax=argmax, hidden_states=None, prenorm=(), logits_top=None)
