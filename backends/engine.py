"""One way to open a client of the container engine (Docker, or Podman's Docker-compatible API).

docker-py asks the engine for its version (`GET /version`) every time a client is made, to pick
the API version it speaks. Podman answers `/version` by running `dpkg-query` (or `rpm`) once per
component it reports: 8 processes, tens of milliseconds of CPU per call, and a test suite or an
env that opens a backend per episode made thousands of them. The answer is asked once per engine
address per process and kept, and every client after the first speaks the API version it gave.
The first client too is made with an API version named (docker-py's minimum), so that docker-py
does not ask before we do: one `/version` per process, not two.
"""

from __future__ import annotations

import os
import threading

PODMAN_SOCKET = "/run/podman/podman.sock"

_versions: dict[str, dict] = {}  # engine address -> its /version answer
_lock = threading.Lock()


def default_base_url() -> str:
    """$DOCKER_HOST, else Podman's rootful socket if present, else Docker's default."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    if os.path.exists(PODMAN_SOCKET):
        return f"unix://{PODMAN_SOCKET}"
    return "unix:///var/run/docker.sock"


def open_engine(base_url: str | None = None, **kwargs):
    """(docker.DockerClient, the engine's /version answer). base_url None: from the environment
    (`docker.from_env`: DOCKER_HOST with DOCKER_TLS_*, or default_base_url()). kwargs go to the
    client (timeout, max_pool_size). Raises what docker-py raises when the engine is unreachable."""
    import docker
    from docker.constants import MINIMUM_DOCKER_API_VERSION

    from_env = base_url is None and bool(os.environ.get("DOCKER_HOST"))
    key = os.environ["DOCKER_HOST"] if from_env else (base_url or default_base_url())
    with _lock:
        known = _versions.get(key)

    def make(v):
        return docker.from_env(version=v, **kwargs) if from_env else docker.DockerClient(base_url=key, version=v,
                                                                                       **kwargs)

    if known is None:
        probe = make(MINIMUM_DOCKER_API_VERSION)  # an API version named: docker-py asks nothing itself
        try:
            known = probe.version(api_version=False)  # GET /version, which every API version answers
        finally:
            probe.close()
        with _lock:
            _versions[key] = known
    return make(known.get("ApiVersion") or MINIMUM_DOCKER_API_VERSION), known
