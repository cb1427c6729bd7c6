"""environment/docker-compose.yaml of Harbor tasks, read as Harbor 0.25's docker environment
reads it (envs/harbor/compose.py): what is honoured, what is a warning, and what is refused
with its name. (The compose tasks of the corpus are played on docker in test_harbor_corpus.py,
the sidecars themselves tested in test_docker_services.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard_gym.envs.harbor.compose import interpolate, parse_compose
from orchard_gym.envs.harbor.config import Settings, TaskRefused
from orchard_gym.envs.harbor.tasks import load_tasks

MAIN_IMAGE = "localhost/orchard/harbor-t:0123456789ab"


def compose(tmp_path: Path, text: str, settings: Settings | None = None, files: dict | None = None):
    env = tmp_path / "task" / "environment"
    env.mkdir(parents=True, exist_ok=True)
    (env / "Dockerfile").write_text("FROM localhost/orchard/bookworm:latest\n")
    for name, content in (files or {}).items():
        (env / name).parent.mkdir(parents=True, exist_ok=True)
        (env / name).write_text(content)
    (env / "docker-compose.yaml").write_text(text)
    return parse_compose(env, settings or Settings(), MAIN_IMAGE)


def test_a_full_file_is_read_as_harbor_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FROM_HOST", "host-value")
    monkeypatch.setenv("MAIN_IMAGE_NAME", "the host's, overridden by Harbor's")
    text = """
x-base: &base localhost/orchard/busybox:latest
version: "3.8"
services:
  main:
    image: ${MAIN_IMAGE_NAME}
    build: {context: .}
    depends_on: [db]
    environment:
      - API=http://api:${PORT:-8000}
      - FROM_HOST
      - NOT_SET_ANYWHERE
    expose: ["22"]
  api:
    build: {context: ./api, dockerfile: Api.dockerfile, args: {V: "1"}}
    command: python3 -m http.server ${PORT:-8000}
    environment: {TOKEN: "$${literal}", FLAG: true, TASK: "${TASK_VAR}"}
    depends_on: {db: {condition: service_healthy}}
    healthcheck: {test: "wget -q -O- http://127.0.0.1:8000/", interval: 1m30s, timeout: 500ms, retries: 4,
                  start_period: 2s}
    ports: ["8000:8000"]
    restart: unless-stopped
  db:
    image: *base
    entrypoint: [sh, -c]
    command: ["exec sleep 1000"]
    working_dir: /data
    user: "1000"
    healthcheck: {test: [CMD-SHELL, "test -e /data"]}
"""
    got = compose(tmp_path, text, Settings(env={"TASK_VAR": "from-task", "PORT": "8001"}),
                  {"api/Api.dockerfile": "FROM x\n"})
    assert got.main_env == {"API": "http://api:8001", "FROM_HOST": "host-value"}
    assert [s.name for s in got.sidecars] == ["db", "api"]  # dependency order
    db, api = got.sidecars
    assert db.image == "localhost/orchard/busybox:latest" and db.build is None
    assert db.spec(db.image).model_dump(exclude_defaults=True) == {
        "name": "db", "image": "localhost/orchard/busybox:latest", "entrypoint": ["sh", "-c"],
        "command": ["exec sleep 1000"], "workdir": "/data", "user": "1000",
        "healthcheck": {"test": ["sh", "-c", "test -e /data"]}}
    assert api.build.context.name == "api" and api.build.dockerfile == "Api.dockerfile" and api.build.args == {"V": "1"}
    spec = api.spec("img")
    assert spec.command == ["python3", "-m", "http.server", "8001"]
    assert spec.env == {"TOKEN": "${literal}", "FLAG": "true", "TASK": "from-task"}
    assert spec.depends_on == {"db": "service_healthy"}
    h = spec.healthcheck
    assert (h.test, h.interval, h.timeout, h.retries, h.start_period) == \
        (["sh", "-c", "wget -q -O- http://127.0.0.1:8000/"], 90.0, 0.5, 4, 2.0)
    assert any("ports are not published" in w for w in got.warnings)
    assert any("restart 'unless-stopped' is not honoured" in w for w in got.warnings)


def test_interpolation_follows_compose():
    v, unset = {"SET": "x", "EMPTY": ""}, set()
    cases = {"$SET": "x", "${SET}": "x", "${NOPE:-d}": "d", "${EMPTY:-d}": "d", "${EMPTY-d}": "",
             "${SET:+alt}": "alt", "${NOPE:+alt}": "", "$$SET": "$SET", "${NOPE:-${SET}}": "x", "${NOPE}": "",
             "a-$SET-b": "a-x-b"}
    for text, want in cases.items():
        assert interpolate(text, v, unset) == want, text
    assert unset == {"NOPE"}
    assert interpolate({"k": ["$SET", 3, None]}, v, set()) == {"k": ["x", 3, None]}
    with pytest.raises(TaskRefused, match=r"\$\{NOPE\} is required \(say why\)"):
        interpolate("${NOPE:?say why}", v, set())


@pytest.mark.parametrize("text, said", [
    ("services: {s: {image: i, volumes: ['/etc:/x']}}", "service 's' uses volumes"),
    ("services: {s: {image: i, networks: [n]}}", "networks of the task's own"),
    ("services: {s: {image: i, network_mode: host}}", "network_mode"),
    ("services: {s: {image: i, privileged: true}}", "privileged"),
    ("services: {s: {image: i, cap_add: [NET_ADMIN]}}", "added capabilities"),
    ("services: {s: {image: i, container_name: fixed}}", "fixed container names"),
    ("services: {s: {image: i, deploy: {}, tmpfs: /t}}", "deploy, tmpfs"),
    ("services: {s: {image: i}}\nvolumes: {data: {}}", "top-level volumes"),
    ("services: {s: {image: i}}\nsecrets: {k: {file: x}}", "top-level secrets"),
    ("services: {s: {image: i}, t: {image: i, depends_on: {s: {condition: service_completed_successfully}}}}",
     "service_completed_successfully"),
    ("services: {main: {command: [sleep, '1']}, s: {image: i}}", "service 'main' uses command"),
    ("services: {main: {build: ./other}, s: {image: i}}", "main.build"),
    ("services: {main: {image: other}, s: {image: i}}", "main.image 'other'"),
    ("services: {main: {depends_on: [nope]}, s: {image: i}}", "main depends on 'nope'"),
    ("services: {a: {image: i, depends_on: [b]}, b: {image: i, depends_on: [a]}}", "cycle"),
    ("services: {a: {image: i, depends_on: [zz]}}", "depends on 'zz'"),
    ("services: {main: {environment: {A: b}}}", "no service besides main"),
    ("services: {s: {}}", "neither build nor image"),
    ("services: {s: {build: ../../..}}", "not a folder of the task"),
    ("services: {s: {build: {context: ., dockerfile: ../../x}}}", "not a file of its context"),
    ("services: {s: {build: {context: ., target: dev}}}", "target not supported"),
    ("services: {s: {image: i, pull_policy: always}}", "nothing is pulled"),
    ("services: {s: {image: i, init: false}}", "init: false"),
    ("services: {Bad.Name: {image: i}}", "service name 'Bad.Name'"),
    ("services: {s: {image: i, healthcheck: {test: [BOGUS, x]}}}", "healthcheck.test"),
    ("services: {s: {image: i, healthcheck: {test: x, interval: soon}}}", "not a duration"),
    ("services: {s: {image: i, healthcheck: {test: x, start_interval: 1s, probe: 1}}}", "probe not supported"),
    ("services: {s: {image: '${NOT_SET_HERE:?needed}'}}", "NOT_SET_HERE"),
    ("services: {s: {image: i, command: {a: 1}}}", "command must be"),
    ("services: {s: {image: i, environment: 7}}", "environment must be"),
    ("services: {s: [1, 2]}", "not a mapping"),
])
def test_what_cannot_run_is_refused_by_name(tmp_path, text, said):
    with pytest.raises(TaskRefused, match=said):
        compose(tmp_path, text)


@pytest.mark.parametrize("text", ["services: [", "just text", "- a list", "", "\x00\x01", "services: 3"])
def test_garbage_files_are_a_clear_error(tmp_path, text):
    with pytest.raises(ValueError, match="docker-compose.yaml (is not valid YAML|has no `services` mapping)"):
        compose(tmp_path, text)


def test_a_compose_task_loads_with_a_local_caveat_and_a_bad_one_is_skipped_with_its_reason(tmp_path):
    for name, text in (("good", "services: {web: {image: localhost/orchard/busybox:latest}}"),
                       ("bad", "services: {web: {image: i, volumes: ['/:/host']}}")):
        root = tmp_path / name
        (root / "environment").mkdir(parents=True)
        (root / "tests").mkdir()
        (root / "task.toml").write_text('version = "1.0"\n')
        (root / "instruction.md").write_text("do it\n")
        (root / "tests" / "test.sh").write_text("true\n")
        (root / "environment" / "Dockerfile").write_text("FROM localhost/orchard/bookworm:latest\n")
        (root / "environment" / "docker-compose.yaml").write_text(text)
    tasks, problems = load_tasks(tmp_path)
    assert list(tasks) == ["good"] and [s.name for s in tasks["good"].compose.sidecars] == ["web"]
    said = {Path(p.path).name: (p.severity, p.message) for p in problems}
    assert said["bad"] == ("error", "docker-compose.yaml: service 'web' uses volumes (a service sees only its "
                                    "image's files): not supported by Orchard's compose support (docker backend; "
                                    "docs/harbor.md)")
    assert said["good"][0] == "warning" and "docker backend only" in said["good"][1]
