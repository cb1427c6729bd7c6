"""Orchard/Harbor-v0 on kubernetes (a pushed image name: envs/harbor/images.py) and its
`[environment] storage_mb` per backend (`SandboxSpec.disk`). Kubernetes runs through the fake
API server (tests/fake_k8s: the real wire protocol; its kubelet runs the pods with Podman, whose
image store stands for the node's, so "pushed" is a tag there)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import orchard_gym  # noqa: F401
from orchard_gym.envs.harbor.env import HarborEnv, HarborOraclePolicy
from orchard_gym.envs.harbor.images import check_registry, ensure_image, pushed_name
from orchard_gym.envs.harbor.tasks import load_tasks
from orchard_gym.errors import ImageNotFound

from conftest import docker_engine, fake_k8s_unavailable, needs, needs_bwrap

DATA = Path(__file__).parent / "data" / "harbor"
_GATEWAY, _WHY_NOT = docker_engine()
REGISTRY = "registry.example.com:5000/team"
MB = 1 << 20
needs_k8s = needs("kubernetes", fake_k8s_unavailable())


def task_folder(tmp_path: Path, name: str = "sum-numbers", storage_mb: int | None = None,
                extra_toml: str = "") -> Path:
    folder = tmp_path / "tasks" / name
    shutil.copytree(DATA / "sum-numbers", folder)
    toml = folder / "task.toml"
    text = toml.read_text() + extra_toml
    if storage_mb is not None:
        text = text.replace("[environment]\n", f"[environment]\nstorage_mb = {storage_mb}\n")
    toml.write_text(text)
    return folder


def play(env: HarborEnv, command: str):
    return env.step({"name": "bash", "arguments": {"command": command}})


@pytest.mark.parametrize("bad", ["http://registry.example.com/team", "registry.example.com/team/",
                                 "registry.example.com/Team", "registry.example.com/team:tag", "team",
                                 "a b.example.com", "", "registry.example.com//team", "-x.example.com"])
def test_garbage_registries_are_refused_clearly(bad, tmp_path):
    with pytest.raises(ValueError, match="image_registry must be a registry host"):
        check_registry(bad)
    with pytest.raises(gym.error.Error, match="image_registry must be a registry host"):
        gym.make("Orchard/Harbor-v0", tasks=str(DATA / "sum-numbers"), image_registry=bad)


def test_the_pushed_name_is_the_content_hash_tag_under_the_registry(tmp_path):
    for registry in ("registry.example.com/team", "localhost:5000", "10.0.0.7:5000/a/b", "docker.io/someone"):
        assert check_registry(registry) == registry
    task = load_tasks(task_folder(tmp_path))[0]["sum-numbers"]
    local = task.image_tag
    assert local.startswith("localhost/orchard/harbor-sum-numbers:")
    assert pushed_name(task, REGISTRY) == f"{REGISTRY}/orchard/harbor-sum-numbers:{local.rsplit(':', 1)[1]}"


@pytest.mark.kubernetes
@needs_k8s
def test_a_harbor_task_runs_on_kubernetes_from_its_pushed_image(tmp_path, fake_k8s):
    import docker

    from orchard_gym.backends.docker import default_base_url

    task = load_tasks(task_folder(tmp_path, storage_mb=256))[0]["sum-numbers"]
    pushed = pushed_name(task, REGISTRY)
    engine = docker.DockerClient(base_url=default_base_url())
    backend = fake_k8s.backend_config(image_pull_policy="Never")  # the fake never pulls: the node has it or not
    try:
        engine.images.get(ensure_image(task, default_base_url())).tag(*pushed.rsplit(":", 1))  # "pushed"
        env = gym.make("Orchard/Harbor-v0", tasks=str(tmp_path / "tasks"), backend=backend,
                       image_registry=REGISTRY).unwrapped
        try:
            obs, _ = env.reset(options={"task_id": "sum-numbers"})
            _, pod = fake_k8s.kube("GET", fake_k8s.pod_path(env.sandbox.record.details["pod"]))
            container = pod["spec"]["containers"][0]
            assert container["image"] == pushed
            assert container["resources"]["limits"]["ephemeral-storage"] == str(256 * MB)  # storage_mb
            obs, _, _, _, info = play(env, "pwd; cat data.txt")
            assert obs.split() == ["/app", "3", "4", "35"], obs  # the image's WORKDIR, not the backend's /workspace
            action = asyncio.run(HarborOraclePolicy().bind(env)([], []))
            env.step(action)
            _, reward, term, _, info = env.step({"name": "submit", "arguments": {}})
            assert (reward, term, info["report"]["reward"]) == (1.0, True, 1.0)
            env.reset(options={"task_id": "sum-numbers"})
            _, reward, _, _, _ = env.step({"name": "submit", "arguments": {}})
            assert reward == 0.0  # doing nothing earns nothing there too
        finally:
            env.close()

        no_registry = gym.make("Orchard/Harbor-v0", tasks=str(tmp_path / "tasks"), backend=backend).unwrapped
        try:
            with pytest.raises(gym.error.Error, match="nothing is built on kubernetes: give the env image_registry"):
                no_registry.reset(options={"task_id": "sum-numbers"})
        finally:
            no_registry.close()

        unpushed = gym.make("Orchard/Harbor-v0", tasks=str(tmp_path / "tasks"), backend=backend,
                            image_registry="registry.example.com/never-pushed").unwrapped
        try:
            with pytest.raises(ImageNotFound, match="registry.example.com/never-pushed/orchard/harbor-sum-numbers"):
                unpushed.reset(options={"task_id": "sum-numbers"})
        finally:
            unpushed.close()
    finally:
        try:
            engine.images.remove(pushed)  # our own tag only
        except docker.errors.ImageNotFound:
            pass
        engine.close()


@pytest.mark.kubernetes
@needs_k8s
def test_a_docker_image_task_runs_on_kubernetes_by_its_name(tmp_path, fake_k8s):
    folder = task_folder(tmp_path, extra_toml='docker_image = "localhost/orchard/bookworm:latest"\n')
    (folder / "environment" / "Dockerfile").unlink()
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\nmkdir -p /app && printf '3\\n4\\n35\\n' > /app/data.txt\n"
                                                  + (DATA / "sum-numbers" / "solution" / "solve.sh").read_text())
    env = gym.make("Orchard/Harbor-v0", tasks=str(folder), backend=fake_k8s.backend_config()).unwrapped
    try:
        env.reset(options={"task_id": "sum-numbers"})
        _, pod = fake_k8s.kube("GET", fake_k8s.pod_path(env.sandbox.record.details["pod"]))
        assert pod["spec"]["containers"][0]["image"] == "localhost/orchard/bookworm:latest"
        env.step(asyncio.run(HarborOraclePolicy().bind(env)([], [])))
        _, reward, _, _, _ = env.step({"name": "submit", "arguments": {}})
        assert reward == 1.0
    finally:
        env.close()


@needs_bwrap
def test_storage_mb_is_the_local_sandboxs_disk(tmp_path, local_root):
    """Red team: the task allows 32 MB; the policy writes 48 MB into its working directory and
    into /tmp, and both fail with ENOSPC (without storage_mb reaching the sandbox, the backend's
    10 GB workdir takes it)."""
    task_folder(tmp_path, storage_mb=32)
    env = gym.make("Orchard/Harbor-v0", tasks=str(tmp_path / "tasks"),
                   backend={"type": "local", "isolation": "bwrap", "root": str(local_root)}).unwrapped
    try:
        env.reset(options={"task_id": "sum-numbers"})
        obs, _, _, _, info = play(env, "head -c 48m /dev/zero > fill")
        assert info["exit_code"] != 0 and "No space left on device" in obs, obs
        obs, _, _, _, info = play(env, "rm -f fill; head -c 48m /dev/zero > /tmp/fill")
        assert info["exit_code"] != 0 and "No space left on device" in obs, obs
        assert env.sandbox.record.sandbox_id and env.client.backend.disk_limit_unavailable() is None
        env.step(asyncio.run(HarborOraclePolicy().bind(env)([], [])))
        _, reward, _, _, _ = env.step({"name": "submit", "arguments": {}})
        assert reward == 1.0  # the task itself fits
    finally:
        env.close()


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_storage_mb_the_docker_engine_cannot_hold_is_a_warning_and_the_task_runs(tmp_path, caplog):
    task_folder(tmp_path, name="storage-on-docker", storage_mb=64)
    env = gym.make("Orchard/Harbor-v0", tasks=str(tmp_path / "tasks"), backend={"type": "docker"}).unwrapped
    try:
        with caplog.at_level(logging.WARNING, "orchard_gym.harbor"):
            env.reset(options={"task_id": "storage-on-docker"})
        why = env.client.backend.disk_limit_unavailable()
        said = [r.getMessage() for r in caplog.records if "storage_mb" in r.getMessage()]
        if why is None:  # an engine with quotas holds it
            assert not said
        else:  # this machine's Podman (overlay on ext4): said once, with the engine's reason
            assert said == [f"Harbor task storage-on-docker: [environment] storage_mb = 64 is not enforced on the "
                            f"docker backend: {why}"]
        env.step(asyncio.run(HarborOraclePolicy().bind(env)([], [])))
        _, reward, _, _, _ = env.step({"name": "submit", "arguments": {}})
        assert reward == 1.0
    finally:
        env.close()


def _orchard(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchard_gym.cli", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("bad", [["--registry", "https://registry.example.com"], ["--registry", "team"]])
def test_orchard_tasks_push_refuses_garbage(bad, tmp_path):
    task_folder(tmp_path)
    done = _orchard("tasks", "push", *bad, str(tmp_path / "tasks"))
    assert done.returncode == 2 and "image_registry must be a registry host" in done.stderr, done.stderr
    done = _orchard("tasks", "push", "--registry", "registry.example.com/team", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "no Harbor tasks at" in done.stderr, done.stderr


@pytest.mark.docker
@needs("docker", None if _GATEWAY else _WHY_NOT)
def test_orchard_tasks_push_tags_the_names_kubernetes_runs_and_says_when_a_push_fails(tmp_path):
    import docker

    from orchard_gym.backends.docker import default_base_url

    task_folder(tmp_path)
    task = load_tasks(tmp_path / "tasks")[0]["sum-numbers"]
    registry = "localhost:9/orchard-push-test"  # nothing listens on port 9: the push itself fails
    name = pushed_name(task, registry)
    engine = docker.DockerClient(base_url=default_base_url())
    try:
        done = _orchard("tasks", "push", "--registry", registry, "--no-push", str(tmp_path / "tasks"))
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == f"sum-numbers\ttagged\t{name}"
        assert engine.images.get(name).id == engine.images.get(task.image_tag).id  # the built image, renamed
        done = _orchard("tasks", "push", "--registry", registry, str(tmp_path / "tasks"))
        assert done.returncode == 1, done.stdout
        line = done.stdout.splitlines()[0]
        assert line.startswith("sum-numbers\tfailed: ") and name in line, line
        assert "0 of 1 task image(s) ready" in done.stdout
    finally:
        try:
            engine.images.remove(name)
        except docker.errors.ImageNotFound:
            pass
        engine.close()


@pytest.mark.parametrize("storage_mb", [8, 2**21])
def test_a_storage_mb_no_sandbox_can_have_skips_the_task_saying_so(tmp_path, storage_mb):
    """Below 16 MB mkfs cannot lay out a workdir; the sandbox's spec refuses it too: refused at
    load, one line, instead of an infrastructure error at every reset."""
    tasks, problems = load_tasks(task_folder(tmp_path, storage_mb=storage_mb))[:2]
    assert "sum-numbers" not in tasks
    assert any(p.severity == "error" and "storage_mb" in p.message and "16 MB to 1 TB" in p.message
               for p in problems), problems
