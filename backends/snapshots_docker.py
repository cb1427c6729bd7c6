"""Snapshots of docker sandboxes: the container committed to a local image.

`docker commit` (the engine pauses the container meanwhile) takes the container's whole
filesystem but not its volumes, so the injected agent (a volume at /opt/orchard-agent)
is not in the image: a sandbox started from the snapshot gets a freshly injected agent
and the snapshot's files. The image is `REPO:<snapshot-id>` (REPO: `localhost/PREFIX-snapshot`),
labelled like the sandboxes (owner, creator, role=snapshot), with the agent token label
blanked. New sandboxes run the image by id, so deleting a snapshot that sandboxes still
run on only untags it (it is re-tagged `REPO-deleted:<id>` and removed by a later sweep
once nothing uses it): the engine refuses to remove an image in use, and forcing it would
remove those containers (Podman).
"""

from __future__ import annotations

import json
import logging
import re
import time

from orchard_gym.errors import BackendError, InvalidRequest, SandboxFailed, SandboxNotFound, SnapshotNotFound
from orchard_gym.models import SNAPSHOT_ID_RE, SnapshotRecord

from .base import new_snapshot_id

try:
    from docker import errors as derr
except ImportError:  # pragma: no cover - the extra is missing
    derr = None

log = logging.getLogger(__name__)


class DockerSnapshots:
    """The snapshot half of a DockerBackend (it calls the backend's engine client)."""

    def __init__(self, backend):
        self.b = backend
        p = backend.config.label_prefix
        self.repo = f"localhost/{p}-snapshot"
        self.graveyard = f"{self.repo}-deleted"  # deleted while sandboxes still ran on them
        # label values stay plain words: the engines parse LABEL changes each their own way
        self.snapshot_label, self.image_label, self.created_label = \
            f"{p}.snapshot", f"{p}.snapshot-image", f"{p}.snapshot-created"

    def _ref(self, snapshot_id: str) -> str:
        if not isinstance(snapshot_id, str) or not SNAPSHOT_ID_RE.match(snapshot_id):
            raise SnapshotNotFound(f"no snapshot {str(snapshot_id)[:80]!r} (snapshot ids are 'snap-' + 16 hex digits)")
        return f"{self.repo}:{snapshot_id}"

    def _inspect(self, snapshot_id: str) -> dict | None:
        try:
            attrs = self.b.api.inspect_image(self._ref(snapshot_id))
        except derr.ImageNotFound:
            return None
        except derr.NotFound:
            return None
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(self.b.role_label) != "snapshot" or labels.get(self.snapshot_label) != snapshot_id:
            return None
        return attrs

    def _record(self, attrs: dict) -> SnapshotRecord:
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        user = self.b.user_label
        try:
            created = float(labels.get(self.created_label, ""))
        except ValueError:
            created = 0.0
        return SnapshotRecord(snapshot_id=labels[self.snapshot_label], sandbox_id=labels.get(self.b.sandbox_label, ""),
                              backend=self.b.name, image=labels.get(self.image_label) or None, created_at=created,
                              size_bytes=attrs.get("Size"),
                              labels={k[len(user):]: v for k, v in labels.items() if k.startswith(user)})

    # ------------------------------------------------------------------ take
    def take(self, sandbox_id: str, extra_labels: dict[str, str] | None = None) -> SnapshotRecord:
        b = self.b
        attrs = b._inspect(sandbox_id)
        if attrs is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        state = (attrs.get("State") or {}).get("Status")
        if state != "running":
            raise SandboxFailed(f"sandbox {sandbox_id} is not running ({state}); cannot snapshot it")
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        source = json.loads(labels.get(b.spec_label) or "{}")
        snapshot_id = new_snapshot_id()
        image = str(source.get("image") or "")
        changes = [f"LABEL {b.token_label}=\"\"",  # the parent's agent token stays with the parent
                   f"LABEL {b.role_label}=snapshot", f"LABEL {self.snapshot_label}={snapshot_id}",
                   f"LABEL {b.owner_label}={b.owner}", f"LABEL {b.creator_label}={b.identity}",
                   f"LABEL {self.created_label}={time.time():.6f}"]
        if image and not any(c.isspace() or c in "\"'\\" for c in image):
            changes.append(f"LABEL {self.image_label}={image}")
        for key, value in (extra_labels or {}).items():  # the claim's owner (word characters and ':')
            if not re.fullmatch(r"[\w.:/-]+", key + value):
                raise InvalidRequest(f"snapshot label {key!r}={value!r}: only letters, digits and ._:/- here")
            changes.append(f"LABEL {b.user_label}{key}={value}")
        try:
            b.api.commit(attrs["Id"], repository=self.repo, tag=snapshot_id, pause=True, changes=changes)
        except derr.NotFound:
            raise SandboxNotFound(f"sandbox {sandbox_id} was deleted while it was being snapshotted") from None
        except derr.APIError as e:
            raise BackendError(f"cannot commit sandbox {sandbox_id}: {e.explanation or e}") from None
        found = self._inspect(snapshot_id)
        if found is None:
            raise BackendError(f"the engine committed {sandbox_id} but has no image {self._ref(snapshot_id)}")
        return self._record(found)

    def image_for(self, snapshot_id: str, image: str | None) -> tuple[str, str]:
        """(the task image a sandbox from this snapshot reports, the image id it runs)."""
        attrs = self._inspect(snapshot_id)
        if attrs is None:
            self._ref(snapshot_id)  # a malformed id says so
            raise SnapshotNotFound(f"no snapshot {snapshot_id!r} (never taken, or deleted)")
        record = self._record(attrs)
        if image not in (None, record.image, self._ref(snapshot_id)):
            raise InvalidRequest(f"snapshot {snapshot_id} is of image {record.image!r}, not {image!r}; leave image "
                                 f"out to start from the snapshot")
        return record.image or attrs["Id"], attrs["Id"]

    # ------------------------------------------------------------------ list, delete, sweep
    def list(self) -> list[SnapshotRecord]:
        b = self.b
        out = []  # one label filter: Podman's image listing matches none when given two
        for summary in b.api.images(filters={"label": [f"{b.owner_label}={b.owner}"]}):
            if (summary.get("Labels") or {}).get(b.role_label) == "snapshot" and any(t.startswith(self.repo + ":") for t in summary.get("RepoTags") or []):
                labels = summary.get("Labels") or {}
                found = self._inspect(labels.get(self.snapshot_label, ""))
                if found is not None:
                    out.append(self._record(found))
        return sorted(out, key=lambda r: r.created_at)

    def delete(self, snapshot_id: str) -> bool:
        try:
            ref = self._ref(snapshot_id)
        except SnapshotNotFound:
            return False
        if self._inspect(snapshot_id) is None:
            return False
        try:
            self.b.api.remove_image(ref, noprune=False)
            return True
        except derr.NotFound:
            return False
        except derr.APIError as e:
            if e.status_code != 409:  # 409: sandboxes run on it; they keep it (by id) until they go
                raise BackendError(f"cannot remove snapshot {snapshot_id}: {e.explanation or e}") from None
        self.b.api.tag(ref, self.graveyard, tag=snapshot_id)
        self.b.api.remove_image(ref)  # with the second name there, this only untags
        return True

    def sweep(self, owner_gone) -> list[str]:
        """Remove snapshots whose per-process owner is gone, and deleted ones nothing uses now."""
        b, removed = self.b, []
        for summary in b.api.images(filters={"label": [f"{b.role_label}=snapshot"]}):
            labels = summary.get("Labels") or {}
            snapshot_id = labels.get(self.snapshot_label, "")
            for tag in summary.get("RepoTags") or []:
                dead = tag.startswith(self.graveyard + ":") or (tag.startswith(self.repo + ":") and owner_gone(labels))
                if not dead:
                    continue
                try:
                    b.api.remove_image(tag)
                    removed.append(snapshot_id)
                except derr.NotFound:
                    pass
                except derr.APIError as e:
                    if e.status_code == 409 and tag.startswith(self.repo + ":"):
                        self.delete(snapshot_id)  # still in use: to the graveyard
                    elif e.status_code != 409:
                        log.warning("docker backend: cannot remove snapshot image %s: %s", tag, e)
        return removed

