"""Prometheus metrics of a watch (``specdiff watch --prometheus-port N``), from its events.

Served on ``/metrics`` by prometheus_client's own HTTP server (a daemon thread), in a registry of
the watch's own (not the process-wide default), so nothing else in the process is exported:

- ``specdiff_watch_requests_total``: requests replayed and diffed;
- ``specdiff_watch_diverged_requests_total``: of them, those whose diff proved a divergence;
- ``specdiff_watch_alerts_total{tensor}``: alerts, by first diverging tensor;
- ``specdiff_watch_diverged``: 1 once a divergence was proved in this run, else 0;
- ``specdiff_watch_acceptance{side,depth}``: rolling per-depth acceptance (side train / serve,
  depth 1-based: depth d = at least d drafts accepted), ``specdiff_watch_mean_accept_length{side}``.
"""

from __future__ import annotations

from specdiff.replay.watch.rolling import SIDES
from specdiff.replay.watch.watcher import WatchEvent
from specdiff.tracer.errors import SpecdiffError


class PrometheusMetrics:
    """Exports a watch's events on ``http://<addr>:<port>/metrics``; call it with each event.

    Raises:
        SpecdiffError: prometheus_client is not installed, or the port cannot be bound.
    """

    def __init__(self, port: int, *, addr: str = "0.0.0.0"):
        try:
            import prometheus_client as pc
        except ImportError:
            raise SpecdiffError("--prometheus-port needs prometheus_client: pip install 'specdiff[watch]'") from None
        reg = self.registry = pc.CollectorRegistry()
        self.requests = pc.Counter("specdiff_watch_requests", "Requests replayed and diffed", registry=reg)
        self.diverged_requests = pc.Counter("specdiff_watch_diverged_requests",
                                            "Requests whose diff proved a divergence", registry=reg)
        self.alerts = pc.Counter("specdiff_watch_alerts", "Alerts by first diverging tensor", ["tensor"],
                                 registry=reg)
        self.diverged = pc.Gauge("specdiff_watch_diverged", "1 once a divergence was proved in this run",
                                 registry=reg)
        self.acceptance = pc.Gauge("specdiff_watch_acceptance", "Rolling per-depth acceptance",
                                   ["side", "depth"], registry=reg)
        self.mean = pc.Gauge("specdiff_watch_mean_accept_length", "Rolling mean accept length (bonus token "
                             "included)", ["side"], registry=reg)
        try:
            self._server, self._thread = pc.start_http_server(int(port), addr=addr, registry=reg)
        except OSError as e:
            raise SpecdiffError(f"--prometheus-port {port}: cannot serve metrics there ({e})") from None

    def __call__(self, event: WatchEvent) -> None:
        data = event.data
        if event.kind == "request":
            self.requests.inc()
            if data.get("diverged"):
                self.diverged_requests.inc()
                self.diverged.set(1)
        elif event.kind == "alert":
            self.alerts.labels(tensor=str(data.get("tensor"))).inc()
        rolling = data.get("rolling")
        if rolling:
            for side in SIDES:
                summary = rolling.get(side) or {}
                for d, v in enumerate(summary.get("per_depth") or []):
                    self.acceptance.labels(side=side, depth=str(d + 1)).set(v)
                if summary.get("mean_accept_length") is not None:
                    self.mean.labels(side=side).set(summary["mean_accept_length"])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
