"""A harness's payload baked into the task's image, for sandboxes of an in-process docker backend.

A sandbox that cannot see the host's installs gets the harness shipped in (`HarnessEnv._launch`).
Uploading the archives and unpacking them at every reset cost each docker sandbox the same
work again: OpenClaw's 249 MB archive unpacks to 858 MB (14.5 CPU-s of gunzip and tar, then
2.8 CPU-s more to delete it with the container), mini-swe-agent's venv 6.5 CPU-s. So on an
in-process docker backend the archives are added to the task's image once, by a build
`FROM <the image's id>` + one `ADD` per archive (the engine unpacks them), tagged
`localhost/orchard/harness-NAME:KEY` where KEY hashes the image's id and the archives; each
sandbox then starts from that image, and its copy-on-write layer costs nothing until written.
The payloads lie under `BAKED_ROOT`, outside the task's working tree. A sandbox of another
backend (kubernetes, an orchestrator's) still gets the archives uploaded at reset.

The images stay on the engine for the next runs, labelled `orchard.harness-baked=NAME`:
`podman image prune --all --filter label=orchard.harness-baked` removes those no container uses.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

BAKED_ROOT = "/opt/orchard-harness"  # where the payloads lie in a baked image
BUILD_TIMEOUT = 900.0


def baked_image(base_url: str, image: str, harness: str, archives: dict[str, Path], lock_dir: Path) -> str | None:
    """The tag of `image` with each archive unpacked at its folder (`archives`: folder in the
    image -> .tar.gz on the host), built once (under a file lock in `lock_dir`: concurrent envs
    wait for one build). None when the engine has no `image`: the backend then pulls it, or says
    why not, and the archives are uploaded as before. Every reset asks: once the image is there
    that is two lookups on the engine, no lock, no build context."""
    import docker

    from orchard_gym.backends.engine import open_engine
    from orchard_gym.envs.harbor.images import build_image

    client, _ = open_engine(base_url, timeout=int(BUILD_TIMEOUT))

    def exists(name: str) -> str | None:  # the image's id, None when the engine has no such image
        try:
            return client.images.get(name).id
        except docker.errors.ImageNotFound:
            return None

    try:
        base_id = exists(image)
        if base_id is None:
            return None
        key = bake_key(base_id, archives)
        tag = f"localhost/orchard/harness-{harness}:{key}"
        if exists(tag):
            return tag
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / f"baked-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if exists(tag):  # another process built it while this one waited
                return tag
            with tempfile.TemporaryDirectory(prefix="orchard-bake-") as context:
                lines = [f"FROM {base_id.removeprefix('sha256:')}", f"LABEL orchard.harness-baked={harness}"]
                for i, (folder, archive) in enumerate(sorted(archives.items())):
                    _link_or_copy(archive, Path(context) / f"payload-{i}.tar.gz")
                    lines.append(f"ADD payload-{i}.tar.gz {folder}/")  # a local .tar.gz is unpacked there
                (Path(context) / "Dockerfile").write_text("\n".join(lines) + "\n")
                return build_image(base_url, tag, Path(context), BUILD_TIMEOUT, f"{harness}'s payload into {image}",
                                   tag)
    finally:
        client.close()


def bake_key(base_id: str, archives: dict[str, Path]) -> str:
    """A hash of the image's id and each archive's folder, name, size and mtime (an archive is
    rewritten, and so gets a new mtime, whenever what it packs changes)."""
    h = hashlib.sha256(base_id.encode())
    for folder, archive in sorted(archives.items()):
        st = archive.stat()
        h.update(f"\0{folder}\0{archive.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copyfile(source, target)
