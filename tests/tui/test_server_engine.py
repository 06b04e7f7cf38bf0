"""``record client`` tells the engine behind a URL from its OpenAI ``/v1/models`` answer (tui/serve_http.py
``server_engine``): the owner an ``EngineSpec.models_owner`` names (vLLM 0.32: 'vllm'), else SGLang; and what
that engine's columns say the client does (the completions API, acceptance from counters). A real HTTP
server on 127.0.0.1 answers as each engine does."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdiff.eagle3.engines import REGISTRY
from specdiff.tui.serve_http import server_engine


def _serving(body: bytes):
    class Models(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("body, engine, model", [
    (json.dumps({"data": [{"id": "tiny", "owned_by": "vllm"}]}).encode(), "vllm", "tiny"),
    (json.dumps({"data": [{"id": "tiny", "owned_by": "sglang"}]}).encode(), "sglang", "tiny"),
    (b"not json", "sglang", None),
])
def test_the_engine_is_the_one_owning_the_model(body, engine, model):
    srv = _serving(body)
    try:
        assert server_engine(f"http://127.0.0.1:{srv.server_port}") == (engine, model)
    finally:
        srv.shutdown()


def test_only_the_counter_engine_sends_completions_and_reads_counters():
    assert {n for n, s in REGISTRY.items() if s.completions_api} == {"vllm"}
    assert {n for n, s in REGISTRY.items() if s.acceptance_counters} == {"vllm"}
    assert {s.models_owner for s in REGISTRY.values() if s.models_owner} == {"vllm"}
