"""A container's usage from its engine (Docker/Podman), for the cost ledger (orchard_gym/ledger.py).

The engine's one-shot stats give cumulative CPU (`cpu_stats.cpu_usage.total_usage`, ns) and
memory in use; Docker on cgroup v1 also gives the peak (`memory_stats.max_usage`). Podman's
Docker-compatible stats carry no peak, so on a local engine the container's own cgroup is
read on the host, found from its init process (`State.Pid`, /proc/PID/cgroup):
`memory.max_usage_in_bytes` (v1) or `memory.peak` (v2, kernel 5.19+). Where that fails the
ledger reads the container's cgroup from inside it (orchard_gym/ledger.py).
"""

from __future__ import annotations

from . import cgroups


def usage_from_stats(stats: dict) -> dict:
    cpu_ns = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    memory = stats.get("memory_stats") or {}
    return {"cpu_seconds": cpu_ns / 1e9 if isinstance(cpu_ns, int) and cpu_ns > 0 else None,
            "memory_peak_bytes": memory.get("max_usage") or None, "memory_bytes": memory.get("usage"),
            "pids": (stats.get("pids_stats") or {}).get("current")}


def host_cgroup_peak(pid: int | None, container_id: str) -> int | None:
    """Peak memory of a container's cgroup read on this host, found from its init process
    (`State.Pid`); None where it cannot be (another pid namespace, no such file)."""
    return cgroups.process_memory_peak(pid, container_id)
