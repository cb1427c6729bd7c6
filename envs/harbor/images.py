"""Where a Harbor task's sandbox image comes from, per backend.

- docker: `environment/` built with the docker SDK, never pulling (FROM must be a local image),
  tagged `localhost/orchard/harbor-NAME:HASH12` by the folder's content hash (`HarborTask.image_tag`)
  and built again only when the folder changes; or `[environment] docker_image` as is.
- kubernetes: nothing is built there. A task with a Dockerfile runs the image pushed as
  `REGISTRY/orchard/harbor-NAME:HASH12` (`pushed_name`: the local tag with `localhost` swapped
  for the env's `image_registry`, so a changed folder is a new name); one with only
  `[environment] docker_image` runs that name as is. `push_images` (`orchard tasks push`)
  builds and pushes them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from orchard_gym.errors import SandboxFailed

from .compose import image_tag as compose_image_tag
from .tasks import IMAGE_PREFIX, HarborTask, folder_hash

# a registry host (a dotted name, or localhost, with an optional :port) and an optional path
# of lowercase components, as docker's reference grammar spells them
_HOST = r"(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)+)(?::[0-9]{1,5})?"
_PATH = r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
REGISTRY_RE = re.compile(rf"^{_HOST}{_PATH}$")


def check_registry(registry: str | None) -> str | None:
    """The `image_registry` given (None: none), or ValueError saying what one looks like."""
    if registry is None:
        return None
    if not isinstance(registry, str) or not REGISTRY_RE.match(registry) or len(registry) > 200:
        raise ValueError(f"image_registry must be a registry host with an optional path, like "
                         f"'registry.example.com/team' or 'localhost:5000' (no scheme, tag or trailing '/'), "
                         f"not {str(registry)[:100]!r}")
    return registry


def pushed_name(task: HarborTask, registry: str) -> str:
    """Where the task's image is pushed: `REGISTRY/orchard/harbor-NAME:HASH12`."""
    return f"{registry}/{task.image_tag.removeprefix('localhost/')}"


def cluster_image(task: HarborTask, registry: str | None) -> str:
    """The image a Kubernetes pod runs for the task (nothing is built on a cluster)."""
    if task.dockerfile is not None:
        if registry is None:
            raise ValueError(
                f"Harbor task {task.task_id} has an environment/Dockerfile and nothing is built on kubernetes: "
                f"give the env image_registry='REGISTRY' and push the image there first (`orchard tasks push "
                f"--registry REGISTRY {task.root.parent}`, or `docker build -t "
                f"REGISTRY/{task.image_tag.removeprefix('localhost/')} {task.root / 'environment'}` and docker push)")
        return pushed_name(task, registry)
    return task.settings.docker_image  # load_task refuses a task with neither


def ensure_image(task: HarborTask, base_url: str) -> str:
    """Build the task's image once per content of environment/ (never pulling); or its docker_image."""
    tag = task.image_tag if task.dockerfile is not None else task.settings.docker_image
    context = task.root / "environment" if task.dockerfile is not None else None
    return build_image(base_url, tag, context, task.build_timeout,
                       f"{task.task_id}'s environment/Dockerfile", f"{task.task_id}: [environment] docker_image")


def build_image(base_url: str, tag: str, context: Path | None, timeout: float, what: str, given: str,
                dockerfile: str = "Dockerfile", buildargs: dict[str, str] | None = None) -> str:
    """`tag` if the engine has it; else built from `context` (pull=False), or SandboxFailed
    when there is none (`given`: what named the image: nothing is pulled)."""
    import docker

    from orchard_gym.backends.engine import open_engine  # here: listing tasks loads no backend

    client, _ = open_engine(base_url, timeout=max(60, int(timeout)))
    try:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            if context is None:
                raise SandboxFailed(f"{given} {tag!r} is not on the engine (nothing is pulled)") from None
        try:
            client.images.build(path=str(context), dockerfile=dockerfile, buildargs=buildargs or None, tag=tag,
                                pull=False, rm=True, forcerm=True)
        except (docker.errors.BuildError, docker.errors.APIError) as e:
            raise SandboxFailed(f"building {what} failed (FROM must be a local image; nothing is pulled): "
                                f"{e}") from None
        return tag
    finally:
        client.close()


def ensure_services(task: HarborTask, base_url: str) -> list[dict]:
    """The task's compose services (compose.py) as ServiceSpec dicts, their images built (or
    found: nothing is pulled)."""
    out = []
    for sidecar in task.compose.sidecars if task.compose else []:
        if sidecar.build is not None:
            tag = compose_image_tag(task.image_tag, sidecar, folder_hash(sidecar.build.context))
            image = build_image(base_url, tag, sidecar.build.context, task.build_timeout,
                                f"{task.task_id}'s service {sidecar.name!r}", "", sidecar.build.dockerfile,
                                sidecar.build.args)
        else:
            image = build_image(base_url, str(sidecar.image), None, task.build_timeout, "",
                                f"{task.task_id}: service {sidecar.name!r}'s image")
        out.append(sidecar.spec(image).model_dump())
    return out


def push_images(tasks: Iterable[HarborTask], registry: str, base_url: str, push: bool = True) -> list[dict]:
    """Build (ensure_image), tag and push each Dockerfile task's image to `registry`; a row per
    task: task_id, local tag, pushed name, status ("pushed", "tagged": push=False, "as is":
    docker_image only, or "failed: WHY"). The engine's credentials for the registry are its own
    (`docker login`)."""
    import docker

    from orchard_gym.backends.engine import open_engine

    check_registry(registry)
    rows = []
    client, _ = open_engine(base_url, timeout=600)
    try:
        for task in tasks:
            if task.dockerfile is None:
                rows.append({"task_id": task.task_id, "local": None, "image": task.settings.docker_image,
                             "status": "as is"})
                continue
            name = pushed_name(task, registry)
            row = {"task_id": task.task_id, "local": task.image_tag, "image": name, "status": "tagged"}
            try:
                ensure_image(task, base_url)
                repository, tag = name.rsplit(":", 1)
                client.images.get(task.image_tag).tag(repository, tag)
                if push:
                    _push(client, repository, tag)
                    row["status"] = "pushed"
            except (SandboxFailed, docker.errors.DockerException) as e:
                said = str(e)
                row["status"] = f"failed: {said if len(said) <= 400 else '...' + said[-400:]}"
            rows.append(row)
    finally:
        client.close()
    return rows


def _push(client, repository: str, tag: str) -> None:
    """docker push; the engine reports a failed push in its stream, not its status code."""
    for event in client.api.push(repository, tag=tag, stream=True, decode=True):
        if isinstance(event, dict) and event.get("error"):
            raise SandboxFailed(f"pushing {repository}:{tag} failed: {event['error']}")


__all__ = ["IMAGE_PREFIX", "REGISTRY_RE", "check_registry", "cluster_image", "ensure_image", "ensure_services",
           "build_image", "pushed_name",
           "push_images"]
