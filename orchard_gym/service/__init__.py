"""The orchestrator: an Orchard-compatible REST API over any backend, with shared state
(in memory, or Redis for several replicas), reconciliation and metrics.

    from orchard_gym.service import ServiceSettings, create_app
    app = create_app(ServiceSettings(api_keys=["secret"]))

Modules, one job each: `settings` (env vars), `api` (routes and wire models: a thin HTTP
layer over the control plane), `app` (the FastAPI factory, middleware, `serve`),
`store`/`redis_store` (shared state), `sandboxes` (the SDK's control plane,
`orchard_gym.control.InProcessControl`, with its records in the store), `execs` (its exec
path: jobs, serialisation, concurrency), `reconciler`, `metrics`, `logs`, `errors`
(exceptions -> HTTP).
"""

from .settings import ServiceSettings

__all__ = ["ServiceSettings", "create_app", "serve"]


def __getattr__(name):  # import FastAPI only when the app is wanted
    if name in ("create_app", "serve"):
        from . import app

        return getattr(app, name)
    raise AttributeError(name)
