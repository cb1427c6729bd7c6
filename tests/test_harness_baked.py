"""A harness's payload baked into the task's image (wrappers/harness/baked.py): keyed by the image
and the archives, built once, unpacked where the launch looks; the harness runs in docker sandboxes
from it in tests/test_harness_docker.py."""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from conftest import docker_engine, needs

from orchard_gym.wrappers.harness.baked import bake_key, baked_image


def _archive(path, files: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_key_follows_the_image_and_every_archive(tmp_path):
    a = _archive(tmp_path / "a.tar.gz", {"x": b"1"})
    b = _archive(tmp_path / "b.tar.gz", {"y": b"2"})
    key = bake_key("sha256:base", {"/opt/a": a, "/opt/b": b})
    assert key == bake_key("sha256:base", {"/opt/b": b, "/opt/a": a})  # the order given does not matter
    assert key != bake_key("sha256:other", {"/opt/a": a, "/opt/b": b})  # another task image
    assert key != bake_key("sha256:base", {"/opt/a": a})  # one archive fewer
    assert key != bake_key("sha256:base", {"/opt/c": a, "/opt/b": b})  # unpacked elsewhere
    _archive(b, {"y": b"22"})  # the payload rebuilt
    assert key != bake_key("sha256:base", {"/opt/a": a, "/opt/b": b})
    os.utime(a, ns=(1, 1))
    assert bake_key("sha256:base", {"/opt/a": a}) != bake_key("sha256:base", {"/opt/a": b})


@pytest.mark.docker
@needs("docker", docker_engine()[1])
def test_a_payload_is_baked_once_where_the_launch_looks_and_a_missing_image_is_not_baked(tmp_path):
    import docker

    from orchard_gym.backends.engine import default_base_url, open_engine
    from orchard_gym.client import SandboxClient

    base_url = default_base_url()
    archive = _archive(tmp_path / "p.tar.gz", {"bin/hello": b"baked\n", "lib/x": b"x"})
    folders = {"/opt/orchard-harness/npm": archive}
    assert baked_image(base_url, "localhost/orchard/no-such-image:1", "demo", folders, tmp_path) is None
    client, _ = open_engine(base_url)
    tags = []
    try:
        tag = baked_image(base_url, "localhost/orchard/busybox:latest", "demo", folders, tmp_path)
        tags.append(tag)
        assert tag is not None and tag.startswith("localhost/orchard/harness-demo:")
        built = client.images.get(tag)
        assert built.labels.get("orchard.harness-baked") == "demo"
        assert baked_image(base_url, "localhost/orchard/busybox:latest", "demo", folders, tmp_path) == tag
        assert client.images.get(tag).id == built.id  # not built again
        with SandboxClient(backend={"type": "docker"}) as sandboxes:
            box = sandboxes.create_sandbox(image=tag)
            try:
                out = box.exec("cat /opt/orchard-harness/npm/bin/hello && ls /opt/orchard-harness/npm")
                assert out.exit_code == 0 and out.stdout.split() == ["baked", "bin", "lib"], out
            finally:
                box.delete()
        _archive(archive, {"bin/hello": b"changed\n"})  # a new payload: a new image
        changed = baked_image(base_url, "localhost/orchard/busybox:latest", "demo", folders, tmp_path)
        tags.append(changed)
        assert changed not in (None, tag)
    finally:
        for t in tags:
            if t:
                try:
                    client.images.remove(t, force=True)
                except docker.errors.ImageNotFound:
                    pass
        client.close()


def test_bake_payloads_refuses_what_is_not_a_bool():
    import gymnasium as gym

    import orchard_gym  # noqa: F401  (registers the envs)

    for garbage in ("no", 0, None, [True]):
        with pytest.raises(gym.error.Error, match="bake_payloads must be True or False"):
            gym.make("Orchard/SWE-v0", harness="mini-swe-agent", backend={"type": "local"}, bake_payloads=garbage)
