"""The Kubernetes backend's control-plane calls: bounded, retried, errors made typed.

A mixin of `KubernetesBackend` (backends/kubernetes.py), which provides `config`,
`server`, `counters` and `_slots` (the bound on calls in flight).
"""

from __future__ import annotations

import json
import random
import time

from orchard_gym.errors import BackendError, InvalidRequest

from .kubernetes_watch import _api_message, _retry_after

try:
    import urllib3
    from kubernetes.client.rest import ApiException
except ImportError:  # pragma: no cover - the extra is missing
    ApiException = urllib3 = None


class ApiCalls:
    def _call(self, fn, *args, idempotent: bool = True, retries: int | None = None, uncertain: list | None = None,
              **kw) -> dict | None:
        """One control-plane call (blocking): JSON in, dict out; bounded and retried. A retry
        after an answer that may follow a done write (5xx) is noted in `uncertain`."""
        cfg = self.config
        kw.setdefault("_preload_content", False)
        kw.setdefault("_request_timeout", (min(10.0, cfg.api_timeout), cfg.api_timeout))
        retries = cfg.api_retries if retries is None else retries
        delay, attempt = 0.05, 0
        while True:
            try:
                with self._slots:
                    self.counters["calls"] += 1
                    resp = fn(*args, **kw)
                data = resp.data
                return json.loads(data) if data else None
            except ApiException as e:
                transient = e.status == 429 or (e.status or 0) >= 500 or e.status == 0
                if not transient or attempt >= retries:
                    raise
                self.counters["throttled" if e.status == 429 else "retried"] += 1
                if e.status != 429 and uncertain is not None:
                    uncertain.append(e.status)
                wait = _retry_after(e)
            except urllib3.exceptions.HTTPError as e:
                # refused before anything was sent: always safe; cut off later: only if idempotent
                sent = not isinstance(getattr(e, "reason", e), urllib3.exceptions.NewConnectionError)
                if attempt >= retries or (sent and not idempotent):
                    raise BackendError(f"Kubernetes API at {self.server}: {e}") from None
                self.counters["retried"] += 1
                wait = None
            attempt += 1
            time.sleep(max(wait or 0.0, delay * (0.5 + random.random())))
            delay = min(delay * 2, 5.0)

    def _api(self, what: str, fn, *args, ok: tuple[int, ...] = (), **kw):
        """_call with errors as typed OrchardErrors; statuses in `ok` come back as None."""
        try:
            return self._call(fn, *args, **kw)
        except ApiException as e:
            if e.status in ok:
                return None
            message = _api_message(e)
            if e.status in (400, 422):
                raise InvalidRequest(f"the cluster refused to {what}: {message}") from None
            if e.status in (401, 403):
                raise BackendError(f"the cluster refused to {what} ({e.status}: {message}); check the "
                                   f"credentials and RBAC (deploy/k8s/base/rbac.yaml)") from None
            raise BackendError(f"cannot {what}: {e.status} {message}") from None
