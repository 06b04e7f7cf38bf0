"""The serving recorder's device path: what only a GPU shows (run on the device machine with
``pytest --noconftest tests/tracer/engines/test_recorder_cuda.py``; the CUDA cases skip here).

On an accelerator ``ServingRecorder.snap`` queues a non-blocking copy into pinned host memory, the
capture carries a CUDA event, and the writer process's publisher thread waits for it off the serving
thread (tracer/engines/recorder.py, tracer/engines/writer/process.py). An engine reuses its device
buffers at once, so a copy that read the buffer late, or a pinned buffer handed to the ring before its
copy landed, would record another iteration's values. Under CUDA-graph capture the hooks must copy
nothing (a copy inside a capture is an error, or is replayed into a freed buffer); a graph replay
runs no Python. The prefill case runs on the CPU too, so the same assertions are checked everywhere.
"""

from __future__ import annotations

import pytest
import torch

from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.attribution import IterCapture
from specdiff.tracer.engines.sglang.draft_stages import DraftStageTaps
from specdiff.tracer.engines.sglang.hooks import Recorder
from specdiff.tracer.store import open_trace

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="the device path: needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]

H, K = 64, 3  # hidden size, aux layers: target.aux_cat rows are [K*H]


def _recorder(path, writer: str = "process") -> Recorder:
    rec = Recorder(Options(path=str(path), writer=writer), SGLangAdapter("0.5.23", log=lambda m: None))
    rec.open({"hidden_size": H}, [], side={"hidden_size": H, "num_aux": K, "topk": 1})
    rec.hidden_size, rec.num_aux = H, K  # what the thread writer's attribution reads (adopt sets them live)
    return rec


@pytest.mark.parametrize("device", DEVICES)
def test_prefill_captures_record_the_values_of_their_iteration_although_the_engine_reuses_its_buffers(
        tmp_path, device):
    """20 prefills through one reused aux buffer [e, K*H] bf16 and one token buffer: each snapped,
    the buffer overwritten right after (as the next layer's output would), a large matmul queued
    before the copies so they are really asynchronous. Each trace row equals the values of its own
    iteration bit for bit; the serving thread never waited for a copy (the publisher did)."""
    # the CPU case checks the test itself, with the in-process writer: the writer process at nice 19
    # took 40-60 s to start and drain beside a loaded test run (5 s alone)
    rec = _recorder(tmp_path / "s.trace", "process" if device == "cuda" else "thread")
    e, n_iter = 7, 20
    aux_buf = torch.empty(e, K * H, dtype=torch.bfloat16, device=device)
    nti_buf = torch.empty(1, dtype=torch.int64, device=device)
    busy = torch.randn(2048, 2048, device=device) if device == "cuda" else None
    want_aux, want_tok = [], []
    g = torch.Generator(device=device).manual_seed(0)
    for i in range(n_iter):
        aux_buf.copy_(torch.randn(e, K * H, generator=g, device=device).to(torch.bfloat16))
        nti_buf.fill_(1000 + i)
        want_aux.append(aux_buf.cpu().clone())
        want_tok.append(1000 + i)
        if busy is not None:  # keeps the stream busy: the copies below run well after they were queued
            busy = (busy @ busy).clamp_(-1, 1)
        rid = f"r{i}"
        cap = IterCapture(iter=i, kind="prefill", rids=[rid], prompts={rid: list(range(5, 5 + e))},
                          prefix_lens=[0], extend_lens=[e], reasons=rec.choose([rid]))
        assert cap.reasons == {rid: "all"}  # the default sampler records every request
        rec.cur = cap
        cap.t["target_aux"] = rec.snap(aux_buf)
        cap.t["next_token_ids"] = rec.snap(nti_buf, dtype=torch.int32)  # a converting copy too
        aux_buf.fill_(float("nan"))  # the engine's next use of the buffer, queued after the copy
        nti_buf.fill_(-1)
        rec.finish(cap, None)
        assert (cap.event is not None) == (device == "cuda")
        rec.cur = None
    rec.close()
    tr = open_trace(str(tmp_path / "s.trace"))
    assert tr.closed
    keys = tr.keys("target.aux_cat")
    got = tr.read_torch("target.aux_cat")
    assert got.shape == (n_iter * e, K * H) and got.dtype == torch.bfloat16
    for i in range(n_iter):
        rows = (keys["seq"] == tr.sequences[i].id).nonzero()[0]
        assert torch.equal(got[torch.as_tensor(rows)], want_aux[i]), f"iteration {i}"
        assert torch.equal(tr.read_torch("target.aux.1")[torch.as_tensor(rows)], want_aux[i][:, H:2 * H])
    argmax = tr.read_torch("target.argmax").flatten().tolist()
    assert sorted(argmax) == want_tok


class _Attn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(2 * H, H)

    def forward(self, positions=None, hidden_states=None, forward_batch=None):
        return self.proj(hidden_states) + positions[:, None].to(hidden_states.dtype)


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = _Attn()

    def forward(self, positions, embeds, hidden_states, forward_batch, residual):
        return self.self_attn(positions=positions, hidden_states=torch.cat([embeds, hidden_states], -1)), hidden_states


class _Norm(torch.nn.Module):
    def forward(self, h, residual):
        s = h + residual
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6), s


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(K * H, H)
        self.layers = torch.nn.ModuleList([_Layer()])
        self.norm = _Norm()


class _Draft(torch.nn.Module):
    """The module tree SGLang 0.5.23's LlamaForCausalLMEagle3 has where specdiff's hooks sit:
    ``model.fc``, ``model.layers.0`` (its forward's 3rd argument), ``model.layers.0.self_attn``
    (keywords positions, hidden_states), ``model.norm`` returning (normed, residual sum)."""

    def __init__(self):
        super().__init__()
        self.model = _Inner()

    def forward(self, aux, embeds, positions):
        h = self.model.fc(aux)
        out, res = self.model.layers[0](positions, embeds, h, None, None)
        return self.model.norm(out, res)[0]


@needs_cuda
def test_hooks_copy_nothing_during_cuda_graph_capture_and_record_eager_forwards_after_replays(tmp_path):
    """The fc hook and the four draft-stage taps, attached to a draft captured in a CUDA graph:
    during the capture they copy nothing and recording stays on; the graph replays (no Python)
    with the right result; an eager forward after the replays is recorded, every stage equal to
    what the forward computed, once the capture's event completes."""
    rec = _recorder(tmp_path / "g.trace")
    torch.manual_seed(0)
    draft = _Draft().cuda()
    rec.ensure_fc_hook(draft)
    taps = DraftStageTaps(snap=rec.snap, capturing=torch.cuda.is_current_stream_capturing, on_error=rec.fail)
    assert taps.attach(draft) == {}
    aux = torch.randn(4, K * H, device="cuda")
    embeds = torch.randn(4, H, device="cuda")
    pos = torch.arange(4, device="cuda")
    rec.cur = IterCapture(iter=0, kind="decode", rids=[])

    s = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph requires
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        draft(aux, embeds, pos)
    torch.cuda.current_stream().wait_stream(s)

    graph = torch.cuda.CUDAGraph()
    rec.fc_sink, sink = [], None
    taps.open()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out = draft(aux, embeds, pos)
    sink = taps.close()
    assert rec.enabled and rec.fc_sink == [] and sink == {}, "a hook copied during capture"

    for k in range(3):
        aux.copy_(torch.randn_like(aux))
        rec.fc_sink = []
        graph.replay()
        torch.cuda.synchronize()
        assert rec.fc_sink == [], "a replay ran Python hooks"
        rec.fc_sink = None  # the reference below is an eager forward: not a recorded one
        with torch.no_grad():
            ref = draft.model.norm(*draft.model.layers[0](pos, embeds, draft.model.fc(aux), None, None))[0]
        torch.testing.assert_close(static_out, ref, rtol=0, atol=0, msg=f"replay {k}")

    with torch.no_grad():  # what the recorded forward below computes, taken unrecorded
        h = draft.model.fc(aux)
        attn_out, res = draft.model.layers[0](pos, embeds, h, None, None)
        summed = attn_out + res
    rec.fc_sink = []
    taps.open()
    with torch.no_grad():
        draft(aux, embeds, pos)
    stages = taps.close()
    ev = torch.cuda.Event()
    ev.record()
    aux.fill_(float("nan"))  # reused at once: the copies were queued before
    ev.synchronize()
    assert rec.enabled
    assert set(stages) == {"draft.hidden_in", "draft.positions", "draft.attn_in", "draft.hidden_out"}
    assert all(t.is_pinned() for t in stages.values())
    assert torch.equal(stages["draft.hidden_in"], h.cpu())
    assert torch.equal(stages["draft.positions"], pos.cpu())
    assert torch.equal(stages["draft.attn_in"], torch.cat([embeds, h], -1).cpu())
    assert torch.equal(stages["draft.hidden_out"], summed.cpu())
    (fc_in, fc_out), = rec.fc_sink
    assert fc_in.is_pinned() and torch.isfinite(fc_in).all() and torch.equal(fc_out, h.cpu())
    rec.cur = None
    rec.close()
