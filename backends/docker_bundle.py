"""The docker backend's shared agent bundle: one read-only volume per injector image.

Copying the ~41 MB bundle into a fresh volume for every sandbox cost ~1.2 s of a ~1.4 s
create. Instead the bundle is copied once per injector *version* (the injector image's id)
into a volume `PREFIX-bundle-<id16>`, which every sandbox mounts read-only at
/opt/orchard-agent. Read-only mounts cannot be written from inside a container (and the
sandbox has no CAP_SYS_ADMIN to remount), so no sandbox can change the bundle another uses.

Filling it once, safely under concurrent creates:
- in one process, a lock: the first create fills, the others wait and reuse it;
- across processes, the filler container's name `PREFIX-bundle-<id16>-fill` is the mutex:
  the engine lets one create win, the losers wait until it is gone and then run their own
  filler, which finds the completion marker and exits at once;
- the filler copies, then writes the marker `.orchard-bundle-complete` last; a volume
  without it (a filler that crashed) is wiped and copied again. No sandbox ever mounts a
  volume before its marker exists, so the wipe never pulls a bundle from under one.
- a backend that finds the volume already there reads the marker on the host when the
  engine listens on a local socket (its volumes are this machine's folders): no filler
  container starts then. Elsewhere, or with no marker, the filler decides as above.

Old versions: `sweep()` removes bundle volumes whose injector image no longer exists on the
engine (build_injector_image.sh removes the previous build) and no container uses (the engine
refuses to remove a volume in use). The current version is never removed by sweep.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

MARKER = ".orchard-bundle-complete"
RECHECK_SECONDS = 10.0  # how long a filled volume is trusted to still exist without asking the engine
# Copy only into a volume without the marker; wipe what a crashed filler left first.
FILL_SCRIPT = (
    'd=$1; if [ -f "$d/' + MARKER + '" ]; then echo "agent bundle present in $d"; exit 0; fi; '
    'rm -rf "$d/bin" "$d/lib" "$d/ssl" "$d/agent" "$d/agent.py" && cp -a /bundle/. "$d/" && sync '
    '&& touch "$d/' + MARKER + '" && echo "agent bundle copied to $d"'
)


def container_lost(e) -> bool:
    """Podman 4.3 under concurrent creates sometimes answers a fresh container's start/inspect/
    remove with a 500 "does not exist in database: no such container": the container is gone."""
    return getattr(e, "status_code", None) == 404 or "no such container" in str(getattr(e, "explanation", "") or e)


def name_in_use(e) -> bool:
    """The engine refused a create because the name is taken (Docker: 409; Podman 4.3: 500)."""
    return e.status_code == 409 or "already in use" in str(getattr(e, "explanation", "") or "")


class SharedBundle:
    """The bundle volumes of one docker backend (`backend` gives api, config, labels, _destroy)."""

    def __init__(self, backend):
        self.backend = backend
        self._lock = threading.Lock()
        self._ready: dict[str, float] = {}  # volumes filled -> when this process last saw them

    def volume_name(self, image_id: str) -> str:
        digest = image_id.split(":", 1)[-1]
        return f"{self.backend.config.label_prefix}-bundle-{digest[:16]}"

    def ensure(self, injector_info: dict) -> str:
        """The name of the filled bundle volume of this injector image (created on first use)."""
        from docker import errors as derr

        name = self.volume_name(injector_info["Id"])
        checked = self._ready.get(name)
        if checked is not None:
            if time.monotonic() - checked < RECHECK_SECONDS:
                return name
            try:  # removed by hand since? fill it again (checked now and then, not per create)
                self.backend.api.inspect_volume(name)
                self._ready[name] = time.monotonic()
                return name
            except derr.NotFound:
                self._ready.pop(name, None)
        with self._lock:
            if name not in self._ready:
                if not self._filled_seen_from_host(name):
                    self._fill(name, injector_info["Id"])
                self._ready[name] = time.monotonic()
        return name

    def _filled_seen_from_host(self, name: str) -> bool:
        """Whether the volume holds the marker, read on this machine's file system: an engine on a
        local socket keeps its volumes on this host, where a root process reads them, so no filler
        container needs to start just to find a volume already filled (one per backend made: a
        container create, start, wait and remove each). False where it cannot tell (a remote engine,
        a rootless one's volumes elsewhere, no marker): then the filler decides, as before."""
        from docker import errors as derr

        if not self.backend.base_url.startswith(("unix://", "/")):
            return False
        try:
            mountpoint = self.backend.api.inspect_volume(name).get("Mountpoint") or ""
        except derr.APIError:
            return False
        return bool(mountpoint) and os.path.isfile(os.path.join(mountpoint, MARKER))

    def _labels(self, image_id: str) -> dict:
        b = self.backend
        return {b.role_label: "bundle", f"{b.config.label_prefix}.bundle-image": image_id}

    def _fill(self, name: str, image_id: str) -> None:
        import docker
        from docker import errors as derr

        from orchard_gym.errors import BackendError

        b, api = self.backend, self.backend.api
        try:
            api.create_volume(name, labels=self._labels(image_id))
        except derr.APIError as e:  # exists (Podman answers 409; Docker returns the existing one)
            if e.status_code != 409:
                raise
        filler = f"{name}-fill"
        # creator labels: a filler left by a crashed process is removed by the usual sweep
        labels = {b.owner_label: b.identity, b.creator_label: b.identity, b.role_label: "bundle-fill"}
        host_config = api.create_host_config(network_mode="none",
                                             mounts=[docker.types.Mount("/agent", name, type="volume")])
        deadline = time.monotonic() + b.config.api_timeout
        while True:
            try:
                api.create_container(image_id, name=filler, entrypoint=["/bin/sh", "-c", FILL_SCRIPT, "fill"],
                                     command=["/agent"], labels=labels, host_config=host_config)
                break
            except derr.APIError as e:
                # Podman can also answer otherwise while the other filler is being removed
                if not name_in_use(e) and not self._exists(filler):
                    raise
            # another process is filling: wait for its filler to finish (or be swept), then check
            if time.monotonic() > deadline:
                raise BackendError(f"agent bundle volume {name}: another filler ({filler}) did not finish "
                                   f"within {b.config.api_timeout:.0f}s; remove it if its process is gone")
            self._remove_stale(filler)
            time.sleep(0.05)
        try:
            api.start(filler)
            code = api.wait(filler, timeout=b.config.api_timeout).get("StatusCode")
            if code != 0:
                tail = api.logs(filler, tail=20).decode("utf-8", "replace").strip()
                raise BackendError(f"filling the agent bundle volume {name} failed (exit {code}): {tail}")
        finally:
            try:
                api.remove_container(filler, force=True)
            except derr.NotFound:
                pass

    def _exists(self, container: str) -> bool:
        from docker import errors as derr

        try:
            self.backend.api.inspect_container(container)
            return True
        except derr.APIError as e:  # 404, or Podman's 500 for one being removed right now
            if container_lost(e):
                return False
            raise

    def _remove_stale(self, filler: str) -> None:
        """Remove another process's filler if that process is gone (it would never finish)."""
        from docker import errors as derr

        from .owners import owner_gone

        try:
            labels = (self.backend.api.inspect_container(filler).get("Config") or {}).get("Labels") or {}
        except derr.APIError as e:  # gone (404, or Podman's 500 while it is being removed)
            if container_lost(e):
                return
            raise
        creator = labels.get(self.backend.creator_label, "")
        if creator and creator != self.backend.identity and owner_gone(creator):
            try:
                self.backend.api.remove_container(filler, force=True)
            except derr.NotFound:
                pass

    def sweep(self, current_image_id: str | None) -> list[str]:
        """Remove bundle volumes of injector images gone from the engine and used by no container."""
        from docker import errors as derr

        b, removed = self.backend, []
        filters = {"label": [f"{b.role_label}=bundle"]}
        for volume in b.api.volumes(filters=filters).get("Volumes") or []:
            image_id = (volume.get("Labels") or {}).get(f"{b.config.label_prefix}.bundle-image", "")
            if not image_id or image_id == current_image_id:
                continue
            try:
                b.api.inspect_image(image_id)
                continue  # that injector version still exists: sandboxes may still be made from it
            except derr.ImageNotFound:
                pass
            except derr.APIError:
                continue
            try:
                b.api.remove_volume(volume["Name"])  # not forced: the engine refuses while one is in use
                removed.append(volume["Name"])
                self._ready.pop(volume["Name"], None)
            except derr.APIError as e:
                log.info("docker backend: old bundle volume %s kept: %s", volume["Name"], e)
        return removed
