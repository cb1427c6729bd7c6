"""`environment/docker-compose.yaml` of a Harbor task: its services beside the agent's.

Read as Harbor 0.25's docker environment uses it (harbor/environments/docker/docker.py): the
file is merged over Harbor's own base, whose service `main` is the agent's container (built
from environment/Dockerfile, or [environment] docker_image, kept alive by `sleep infinity`);
every other service is a sidecar on the project's network, where `main` (the agent, and the
verifier, which runs in `main`) reaches it by its service name. Relative paths (a `build`
context) are relative to environment/; `${VAR}` is interpolated from the host's environment,
the task's `[environment] env` and Harbor's own variables (MAIN_IMAGE_NAME, CONTEXT_DIR,
PREBUILT_IMAGE_NAME, CPUS, MEMORY), Harbor's taking precedence; `docker compose up --wait`
starts everything and waits for each healthcheck before the agent starts.

Here `main` is the Orchard sandbox (the agent injected as usual) and each other service a
`ServiceSpec` the docker backend runs (backends/docker_services.py). Every key is honoured,
warned about, or refused with its name (`TaskRefused`): nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard_gym.models import SERVICE_NAME_RE, ServiceHealthcheck, ServiceSpec, check_services

from .config import Settings, TaskRefused

COMPOSE_FILE = "docker-compose.yaml"  # the one name Harbor's docker environment looks for
MAIN = "main"
# keys of `main` the task's file may set (Harbor's base sets build/image/command itself)
MAIN_KEYS = {"build", "image", "environment", "depends_on", "expose", "init", "pull_policy"}
SERVICE_KEYS = {"build", "image", "command", "entrypoint", "environment", "working_dir", "user", "depends_on",
                "healthcheck", "expose", "init", "pull_policy", "restart", "ports"}
TOP_KEYS = {"services", "version", "name"}
WHY_NOT = {  # what a refused key would need
    "volumes": "volumes (a service sees only its image's files)", "networks": "networks of the task's own",
    "network_mode": "network_mode", "privileged": "privileged containers",
    "cap_add": "added capabilities", "container_name": "fixed container names (sandboxes run side by side)",
}
VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])((?:[^{}]|\{[^{}]*\})*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")


@dataclass
class Build:
    context: Path
    dockerfile: str = "Dockerfile"
    args: dict[str, str] = field(default_factory=dict)


@dataclass
class Sidecar:
    """A service of the file but `main`: a ServiceSpec once its image is there (`spec`)."""

    name: str
    image: str | None
    build: Build | None
    fields: dict[str, Any]  # the ServiceSpec's other fields

    def spec(self, image: str) -> ServiceSpec:
        return ServiceSpec(name=self.name, image=image, **self.fields)


@dataclass
class Compose:
    sidecars: list[Sidecar]
    main_env: dict[str, str]
    warnings: list[str]


def interpolate(value: Any, variables: dict[str, str], unset: set[str]) -> Any:
    """Compose's `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}`,
    `${VAR:+other}` and `$$` in every string of `value` (names found unset go into `unset`)."""
    if isinstance(value, dict):
        return {k: interpolate(v, variables, unset) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, variables, unset) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4) or ""
        have = variables.get(name)
        empty_counts = op is not None and op.startswith(":")
        present = have is not None and (have != "" or not empty_counts)
        if op in (":-", "-"):
            return have if present else interpolate(arg, variables, unset)
        if op in (":+", "+"):
            return interpolate(arg, variables, unset) if present else ""
        if op in (":?", "?"):
            if not present:
                raise TaskRefused(f"{COMPOSE_FILE}: ${{{name}}} is required ({arg or 'not set'})")
            return have
        if have is None:
            unset.add(name)
        return have or ""
    return VAR.sub(one, value)


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise TaskRefused(f"{COMPOSE_FILE}: {what} = {value!r} is not a duration like '5s' or '1m30s'")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def _argv(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise TaskRefused(f"{COMPOSE_FILE}: {what} must be a string or a list of strings")


def _environment(value: Any, variables: dict[str, str], what: str) -> dict[str, str]:
    """A service's `environment` (a mapping, or a list of KEY=VALUE / KEY): a bare KEY takes the
    variable's value and is left out when it has none, as compose does."""
    if value is None:
        return {}
    items: list[tuple[str, Any]]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = [tuple(v.split("=", 1)) if "=" in v else (v, None) for v in map(str, value)]  # type: ignore[misc]
    else:
        raise TaskRefused(f"{COMPOSE_FILE}: {what} must be a mapping or a list")
    out = {}
    for key, val in items:
        if val is None:
            val = variables.get(str(key))
            if val is None:
                continue
        out[str(key)] = "true" if val is True else "false" if val is False else str(val)
    return out


def _healthcheck(value: Any, what: str) -> ServiceHealthcheck | None:
    if not isinstance(value, dict):
        raise TaskRefused(f"{COMPOSE_FILE}: {what} must be a mapping")
    unknown = set(value) - {"test", "interval", "timeout", "retries", "start_period", "start_interval", "disable"}
    if unknown:
        raise TaskRefused(f"{COMPOSE_FILE}: {what}: {', '.join(sorted(unknown))} not supported")
    test = value.get("test")
    if value.get("disable") or test in (["NONE"], "NONE"):
        return None
    if isinstance(test, str):
        argv = ["sh", "-c", test]
    elif isinstance(test, list) and test and test[0] == "CMD" and len(test) > 1:
        argv = [str(t) for t in test[1:]]
    elif isinstance(test, list) and test and test[0] == "CMD-SHELL" and len(test) > 1:
        argv = ["sh", "-c", " ".join(str(t) for t in test[1:])]
    else:
        raise TaskRefused(f"{COMPOSE_FILE}: {what}.test must be a string, [CMD, ...] or [CMD-SHELL, ...], "
                          f"not {test!r} (an image's own HEALTHCHECK is not run: write it here)")
    timing = {k: _seconds(value[k], f"{what}.{k}") for k in ("interval", "timeout", "start_period") if k in value}
    if "retries" in value:
        timing["retries"] = value["retries"]
    return ServiceHealthcheck(test=argv, **timing)


def _depends_on(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):
        return {str(v): "service_started" for v in value}
    if not isinstance(value, dict):
        raise TaskRefused(f"{COMPOSE_FILE}: {what} must be a list or a mapping")
    out = {}
    for name, cond in value.items():
        condition = (cond or {}).get("condition", "service_started") if isinstance(cond, dict) else "service_started"
        if condition not in ("service_started", "service_healthy"):
            raise TaskRefused(f"{COMPOSE_FILE}: {what}.{name}: condition {condition!r} is not supported "
                              f"(service_started and service_healthy are)")
        out[str(name)] = condition
    return out


def _build(value: Any, env_dir: Path, what: str) -> Build:
    spec = {"context": value} if isinstance(value, str) else value
    if not isinstance(spec, dict):
        raise TaskRefused(f"{COMPOSE_FILE}: {what} must be a path or a mapping")
    unknown = set(spec) - {"context", "dockerfile", "args"}
    if unknown:
        raise TaskRefused(f"{COMPOSE_FILE}: {what}: {', '.join(sorted(unknown))} not supported (context, "
                          f"dockerfile and args are)")
    context = (env_dir / str(spec.get("context", "."))).resolve()
    task_root = env_dir.resolve().parent
    if not context.is_dir() or not context.is_relative_to(task_root):
        raise TaskRefused(f"{COMPOSE_FILE}: {what}.context {spec.get('context')!r} is not a folder of the task")
    dockerfile = str(spec.get("dockerfile", "Dockerfile"))
    if not (context / dockerfile).resolve().is_relative_to(context) or not (context / dockerfile).is_file():
        raise TaskRefused(f"{COMPOSE_FILE}: {what}.dockerfile {dockerfile!r} is not a file of its context")
    args = spec.get("args") or {}
    if isinstance(args, list):
        args = dict(a.split("=", 1) for a in map(str, args) if "=" in a)
    return Build(context=context, dockerfile=dockerfile, args={str(k): str(v) for k, v in args.items()})


def _check_keys(config: dict, allowed: set[str], service: str, warnings: list[str]) -> None:
    refused = sorted(k for k in config if k not in allowed and not str(k).startswith("x-"))
    if refused:
        named = ", ".join(WHY_NOT.get(k, k) for k in refused)
        raise TaskRefused(f"{COMPOSE_FILE}: service {service!r} uses {named}: not supported by Orchard's compose "
                          f"support (docker backend; docs/harbor.md)")
    if config.get("ports"):
        warnings.append(f"{COMPOSE_FILE}: service {service!r}: ports are not published on the host (the sandbox "
                        f"reaches the service by name, on any port)")
    if config.get("restart") not in (None, "no"):
        warnings.append(f"{COMPOSE_FILE}: service {service!r}: restart {config['restart']!r} is not honoured "
                        f"(a service that exits stays down)")
    if config.get("init") is False:
        raise TaskRefused(f"{COMPOSE_FILE}: service {service!r}: init: false (every container here has an init)")
    if config.get("pull_policy") == "always":
        raise TaskRefused(f"{COMPOSE_FILE}: service {service!r}: pull_policy: always (nothing is pulled here)")


def variables(env_dir: Path, settings: Settings, main_image: str) -> dict[str, str]:
    """What Harbor interpolates the file with: the host's environment, the task's env, and
    Harbor's own variables over both."""
    infra = {"MAIN_IMAGE_NAME": main_image, "CONTEXT_DIR": str(env_dir.resolve())}
    if settings.docker_image:
        infra["PREBUILT_IMAGE_NAME"] = settings.docker_image
    if settings.cpus is not None:
        infra["CPUS"] = str(settings.cpus)
    if settings.memory_mb is not None:
        infra["MEMORY"] = f"{settings.memory_mb}M"
    return {**os.environ, **settings.env, **infra}


def parse_compose(env_dir: Path, settings: Settings, main_image: str) -> Compose:
    """The task's compose file, reviewed key by key; TaskRefused naming what cannot run."""
    try:
        import yaml  # the docker extra's (compose is a docker-backend feature)
    except ImportError:
        raise TaskRefused(f"reading environment/{COMPOSE_FILE} needs PyYAML: pip install 'orchard-gym[docker]'") from None

    path = env_dir / COMPOSE_FILE
    try:
        doc = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"environment/{COMPOSE_FILE} is not valid YAML: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise ValueError(f"environment/{COMPOSE_FILE} has no `services` mapping")
    top = sorted(k for k in doc if k not in TOP_KEYS and not str(k).startswith("x-") and doc[k])
    if top:
        raise TaskRefused(f"{COMPOSE_FILE}: top-level {', '.join(top)} not supported (services only)")
    warnings: list[str] = []
    names = variables(env_dir, settings, main_image)
    unset: set[str] = set()
    services = interpolate(doc["services"], names, unset)
    main_env, main_deps, sidecars = {}, {}, []
    for name, config in services.items():
        name, config = str(name), config or {}
        if not isinstance(config, dict):
            raise TaskRefused(f"{COMPOSE_FILE}: service {name!r} is not a mapping")
        if name == MAIN:
            _check_keys(config, MAIN_KEYS, name, warnings)
            if "build" in config and _build(config["build"], env_dir, "main.build") != Build(env_dir.resolve()):
                raise TaskRefused(f"{COMPOSE_FILE}: main.build must be environment/ with its Dockerfile (the "
                                  f"agent's image); another build is not supported")
            if "image" in config and config["image"] not in (main_image, settings.docker_image):
                raise TaskRefused(f"{COMPOSE_FILE}: main.image {config['image']!r}: the agent's image is "
                                  f"environment/Dockerfile's build or [environment] docker_image")
            main_env = _environment(config.get("environment"), names, "main.environment")
            main_deps = _depends_on(config.get("depends_on"), "main.depends_on")
            continue
        if not SERVICE_NAME_RE.match(name):
            raise TaskRefused(f"{COMPOSE_FILE}: service name {name!r}: lowercase letters, digits, '-' and '_' only")
        _check_keys(config, SERVICE_KEYS, name, warnings)
        if "build" not in config and not config.get("image"):
            raise TaskRefused(f"{COMPOSE_FILE}: service {name!r} has neither build nor image")
        fields: dict[str, Any] = {
            "env": _environment(config.get("environment"), names, f"{name}.environment"),
            "depends_on": _depends_on(config.get("depends_on"), f"{name}.depends_on")}
        for key, out in (("command", "command"), ("entrypoint", "entrypoint")):
            if config.get(key) is not None:
                fields[out] = _argv(config[key], f"{name}.{key}")
        for key, out in (("working_dir", "workdir"), ("user", "user")):
            if config.get(key) is not None:
                fields[out] = str(config[key])
        if config.get("healthcheck") is not None:
            fields["healthcheck"] = _healthcheck(config["healthcheck"], f"{name}.healthcheck")
        build = _build(config["build"], env_dir, f"{name}.build") if "build" in config else None
        sidecars.append(Sidecar(name=name, image=config.get("image"), build=build, fields=fields))
    if not sidecars:
        raise TaskRefused(f"{COMPOSE_FILE}: no service besides main (nothing for compose support to run)")
    try:  # names, dependencies, cycles: as the backend will check them
        order = check_services([s.spec(s.image or "built") for s in sidecars])
    except ValueError as e:
        raise TaskRefused(f"{COMPOSE_FILE}: {e}") from None
    for dep in main_deps:
        if dep not in {s.name for s in sidecars}:
            raise TaskRefused(f"{COMPOSE_FILE}: main depends on {dep!r}, which is not a service of the file")
    if unset:
        warnings.append(f"{COMPOSE_FILE}: {', '.join(sorted(unset))} not set: empty, as compose makes them")
    by_name = {s.name: s for s in sidecars}
    return Compose(sidecars=[by_name[s.name] for s in order], main_env=main_env, warnings=warnings)


def image_tag(task_image: str, sidecar: Sidecar, context_hash: str) -> str:
    """The tag of a sidecar's build: the task image's repository + the service, and a hash of
    its context (`context_hash`), Dockerfile name and build args (built again when one changes)."""
    assert sidecar.build is not None
    digest = hashlib.sha256(context_hash.encode())
    digest.update(repr((sidecar.build.dockerfile, sorted(sidecar.build.args.items()))).encode())
    return f"{task_image.rsplit(':', 1)[0]}-{sidecar.name}:{digest.hexdigest()[:12]}"
