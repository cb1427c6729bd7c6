"""Prometheus metrics of one replica (`GET /metrics`). Each app has its own registry, so
several apps can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from orchard_gym.models import JobResult

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("orchard_http_requests_total", "HTTP requests by route and status",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("orchard_http_request_seconds", "HTTP request latency by route",
                                 ["method", "route"], buckets=_LATENCY, registry=r)
        self.jobs = Counter("orchard_jobs_total", "finished commands by outcome", ["status"], registry=r)
        self.exec_seconds = Histogram("orchard_exec_seconds", "time from a command's start to its end",
                                      buckets=_LATENCY, registry=r)
        self.ready_seconds = Histogram("orchard_sandbox_ready_seconds", "time from create to ready",
                                       ["status"], buckets=_LATENCY, registry=r)
        self.rejected = Counter("orchard_exec_rejected_total", "commands refused with 503 (saturated)", registry=r)
        self.reconcile_seconds = Histogram("orchard_reconcile_seconds", "duration of reconciliation passes",
                                           buckets=_LATENCY, registry=r)
        self.reconciled = Counter("orchard_reconciled_total", "what reconciliation did", ["action"], registry=r)
        self.execs_running = Gauge("orchard_execs_running", "commands running on this replica", registry=r)
        self.execs_waiting = Gauge("orchard_execs_waiting", "commands waiting for their turn", registry=r)
        self.sandboxes = Gauge("orchard_sandboxes", "sandboxes in the store by status", ["status"], registry=r)

        self._request_children: dict[tuple[str, str, str], tuple] = {}

    def observe_request(self, method: str, route: str, status: str, seconds: float) -> None:
        """One HTTP request: the labelled children are looked up once per (method, route,
        status) and kept, so a request costs a dict lookup, an increment and an observe."""
        children = self._request_children.get((method, route, status))
        if children is None:
            children = self._request_children[(method, route, status)] = (
                self.requests.labels(method, route, status), self.latency.labels(method, route))
        children[0].inc()
        children[1].observe(seconds)

    def observe_job(self, job: JobResult) -> None:
        self.jobs.labels(job.status).inc()
        if job.started_at and job.completed_at:
            self.exec_seconds.observe(max(0.0, job.completed_at - job.started_at))

    def observe_ready(self, status: str, seconds: float) -> None:
        self.ready_seconds.labels(status).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
