"""The Kubernetes backend's control-plane calls: bounded, retried, errors made typed.

A mixin of `KubernetesBackend` (backends/kubernetes.py), which provides `config`,
`server`, `counters` and `_slots` (the bound on calls in flight).
"""

from __future__ import annotations

import json

from orchard_gym.errors import BackendError, InvalidRequest

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from orchard_gym.retry import wait_backoff

from .kubernetes_errors import api_message, retry_after

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

        def transient(e: BaseException) -> bool:
            if isinstance(e, ApiException):
                return e.status == 429 or (e.status or 0) >= 500 or e.status == 0
            if isinstance(e, urllib3.exceptions.HTTPError):
                # refused before anything was sent: always safe; cut off later: only if idempotent
                return idempotent or isinstance(getattr(e, "reason", e), urllib3.exceptions.NewConnectionError)
            return False

        def note(state: RetryCallState) -> None:
            e = state.outcome.exception() if state.outcome is not None else None
            status = e.status if isinstance(e, ApiException) else None
            self.counters["throttled" if status == 429 else "retried"] += 1
            if isinstance(e, ApiException) and status != 429 and uncertain is not None:
                uncertain.append(status)

        try:
            for attempt in Retrying(retry=retry_if_exception(transient), stop=stop_after_attempt(retries + 1),
                                    wait=wait_backoff(0.05, 5.0, hint=retry_after), before_sleep=note,
                                    reraise=True):
                with attempt:
                    with self._slots:
                        self.counters["calls"] += 1
                        resp = fn(*args, **kw)
                    data = resp.data
                    return json.loads(data) if data else None
        except urllib3.exceptions.HTTPError as e:
            raise BackendError(f"Kubernetes API at {self.server}: {e}") from None
        raise AssertionError("unreachable")

    def _api(self, what: str, fn, *args, ok: tuple[int, ...] = (), **kw):
        """_call with errors as typed OrchardErrors; statuses in `ok` come back as None."""
        try:
            return self._call(fn, *args, **kw)
        except ApiException as e:
            if e.status in ok:
                return None
            message = api_message(e)
            if e.status in (400, 422):
                raise InvalidRequest(f"the cluster refused to {what}: {message}") from None
            if e.status in (401, 403):
                raise BackendError(f"the cluster refused to {what} ({e.status}: {message}); check the "
                                   f"credentials and RBAC (deploy/k8s/base/rbac.yaml)") from None
            raise BackendError(f"cannot {what}: {e.status} {message}") from None
