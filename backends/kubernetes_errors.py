"""What a failed Kubernetes API call says: its message, and how long it asks us to wait.
Shared by the backend's calls (kubernetes_api.py), its pod watch and the backend itself."""

from __future__ import annotations

import json

MAX_RETRY_AFTER = 30.0  # seconds: a longer Retry-After is capped, the cluster is still polled


def api_message(e) -> str:
    """The `message` of a kubernetes ApiException's Status body (its reason if there is none)."""
    try:
        return json.loads(e.body).get("message") or e.reason
    except (TypeError, ValueError, AttributeError):
        return str(e.reason or e.body or e)


def retry_after(e: BaseException) -> float | None:
    """The seconds an answer's Retry-After header asks for (at most MAX_RETRY_AFTER); None without one."""
    headers = getattr(e, "headers", None)
    if not headers:
        return None
    try:
        value = headers.get("Retry-After")
        return min(float(value), MAX_RETRY_AFTER) if value is not None else None
    except (TypeError, ValueError):
        return None
