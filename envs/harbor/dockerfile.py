"""A task's `environment/Dockerfile` as set-up steps, for backends that build no image (local).

The local backend runs on the host's userland, so `FROM` cannot be honoured (one warning);
the rest becomes set-up run in the sandbox, in order:

- `WORKDIR` / `ENV` / `ARG`: the directory and environment of later steps (and of the agent
  and the verifier: a container keeps its image's `ENV`);
- `COPY` / `ADD` (sources in the task's `environment/`, the build context): files uploaded
  into the sandbox (ADD of a local tar archive unpacks it, as Docker does);
- `RUN`: run in the sandbox (`RUN pip install PKG...` alone: the packages go into a venv
  built once on the host, first on PATH, since sandboxes have no index to install from);
- `USER`: `root` is honoured (the sandbox's user); any other user is a warning.

Paths: the image's final working directory (/app without a WORKDIR, Harbor's convention) is
the sandbox's working directory; a path
below it maps there. Anything that must write elsewhere on the image's root (COPY to /etc,
WORKDIR /opt/x outside it) is refused with the step's line number.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath

IGNORED = {"CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER", "ONBUILD"}
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


class DockerfileError(ValueError):
    """A Dockerfile step the local backend cannot reproduce."""


@dataclass
class Step:
    kind: str  # "run" | "pip" | "copy"
    line: int
    cwd: str  # the image path it runs in
    env: dict[str, str]
    command: str = ""  # run
    packages: list[str] = field(default_factory=list)  # pip
    sources: list[str] = field(default_factory=list)  # copy: paths in the build context
    dest: str = ""  # copy: the image path
    unpack: bool = False  # ADD of a tar archive


@dataclass
class Plan:
    base: str | None = None  # FROM's image (not honoured locally)
    workdir: str = "/"  # the image's final WORKDIR
    env: dict[str, str] = field(default_factory=dict)  # the image's final ENV
    user: str | None = None
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def packages(self) -> list[str]:
        return [p for s in self.steps if s.kind == "pip" for p in s.packages]


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, instruction) with continuations joined and comments dropped."""
    out, buf, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        out.append((start, buf + stripped))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def expand(text: str, env: dict[str, str]) -> str:
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(3), m.group(2) or ""), text)


def _args(rest: str) -> list[str]:
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return shlex.split(rest)


def _pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # ENV KEY value with spaces
        return {words[0]: rest.split(None, 1)[1].strip() if len(words) > 1 else ""}
    return dict(w.split("=", 1) for w in words if "=" in w)


def pip_packages(command: str) -> list[str] | None:
    """The packages of a `RUN pip install PKG...` with nothing else in it, else None."""
    m = re.fullmatch(r"(?:python3?\s+-m\s+)?pip3?\s+install\s+(.+)", command.strip(), re.IGNORECASE)
    if m is None or re.search(r"[;&|<>`$()]", m.group(1)):
        return None
    words = shlex.split(m.group(1))
    if any(w.startswith("-") and w not in ("--no-cache-dir", "-q", "--quiet", "-U", "--upgrade") for w in words):
        return None
    return [w for w in words if not w.startswith("-")]


def parse(text: str, workdir_override: str | None = None) -> Plan:
    """The Dockerfile's steps; DockerfileError for what no host userland can reproduce."""
    plan, cwd, env, args = Plan(), "/", {}, {}
    lines = logical_lines(text)
    if not lines or lines[0][1].split(None, 1)[0].upper() not in ("FROM", "ARG"):
        raise DockerfileError("a Dockerfile starts with FROM")
    for number, line in lines:
        word, _, rest = line.partition(" ")
        op, rest = word.upper(), rest.strip()
        scope = {**args, **env}
        if op == "FROM":
            if plan.base is not None:
                raise DockerfileError(f"line {number}: a second FROM (multi-stage builds) needs the docker backend")
            plan.base = rest.split()[0] if rest else ""
        elif op == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = expand(default.strip().strip('"'), scope)
        elif op == "ENV":
            env.update({k: expand(v.strip('"'), scope) for k, v in _pairs(rest).items()})
        elif op == "WORKDIR":
            cwd = str(PurePosixPath(cwd) / expand(rest.strip('"'), scope))
        elif op in ("COPY", "ADD"):
            words = _args(rest)
            flags = [w for w in words if w.startswith("--")]
            words = [w for w in words if not w.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                raise DockerfileError(f"line {number}: COPY --from (multi-stage builds) needs the docker backend")
            if len(words) < 2:
                raise DockerfileError(f"line {number}: {op} needs a source and a destination")
            sources, dest = [expand(w, scope) for w in words[:-1]], expand(words[-1], scope)
            if op == "ADD" and any(re.match(r"^[a-z]+://", s) for s in sources):
                raise DockerfileError(f"line {number}: ADD of a URL: sandboxes fetch nothing at set-up")
            if any(PurePosixPath(s).is_absolute() or ".." in PurePosixPath(s).parts for s in sources):
                raise DockerfileError(f"line {number}: {op} sources must be inside the build context")
            if flags:
                plan.warnings.append(f"Dockerfile line {number}: {op} {' '.join(flags)} not honoured on local")
            target = dest if dest.startswith("/") else str(PurePosixPath(cwd) / dest) + ("/" if dest.endswith("/") else "")
            unpack = op == "ADD" and all(re.search(r"\.(tar|tar\.gz|tgz|tar\.bz2|tar\.xz)$", s) for s in sources)
            plan.steps.append(Step("copy", number, cwd, dict(env), sources=sources, dest=target, unpack=unpack))
        elif op == "RUN":
            words = _args(rest) if rest.startswith("[") else None
            command = shlex.join(words) if words else rest
            packages = pip_packages(command)
            if packages is not None:
                plan.steps.append(Step("pip", number, cwd, dict(env), command=command, packages=packages))
            else:
                plan.steps.append(Step("run", number, cwd, {**args, **env}, command=command))
        elif op == "USER":
            plan.user = rest.split(":")[0]
            if plan.user not in ("root", "0"):
                plan.warnings.append(f"Dockerfile line {number}: USER {rest}: the local sandbox runs as its own "
                                     f"user; not switched")
        elif op == "SHELL":
            raise DockerfileError(f"line {number}: SHELL is not supported on local (set-up runs with bash)")
        elif op in IGNORED:
            plan.warnings.append(f"Dockerfile line {number}: {op} ignored (Harbor runs commands through exec)")
        else:
            raise DockerfileError(f"line {number}: unknown instruction {op}")
    # no WORKDIR: Harbor's tasks still work in /app (their convention), which the sandbox's folder stands for
    plan.workdir = workdir_override or (cwd if cwd != "/" else "/app")
    plan.env = env
    return plan


def local_path(path: str, workdir: str, image_workdir: str) -> str:
    """An image path in the local sandbox: below the image's WORKDIR maps into `workdir`."""
    p, root = PurePosixPath(path), PurePosixPath(image_workdir)
    if root == PurePosixPath("/"):
        raise DockerfileError("the image's WORKDIR is / (or unset): on local the sandbox's working directory "
                              "stands for it, so give the Dockerfile a WORKDIR")
    if p == root:
        return workdir
    if root in p.parents:
        return f"{workdir}/{p.relative_to(root)}"
    raise DockerfileError(f"{path} is outside the image's WORKDIR {image_workdir}: the local backend runs on the "
                          f"host's userland and writes only below the working directory; use the docker backend")
