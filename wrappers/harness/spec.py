"""Harnesses as data: how to install one and how to start it inside a sandbox.

A harness is an agent program that owns its loop and calls a model API (mini-swe-agent,
Codex CLI, Claude Code, ...). A `Harness` says, as plain data:

- **install**: pip `requirements` (a cached venv on the host) and/or pinned `npm` packages
  (a cached npm prefix on the host); local sandboxes see both read-only, docker and
  kubernetes ones get them shipped in (`sandbox_payload`, `ShippedVenv`);
- **config**: `files`, templates written into the harness's scratch folder before it
  starts (e.g. Codex's `config.toml`);
- **model URL**: always `OPENAI_BASE_URL`/`OPENAI_API_BASE`; `model_url_env` names more
  variables to set to it (e.g. `ANTHROPIC_BASE_URL`), and `files` can use it;
- **task text**: in the file `$ORCHARD_TASK_FILE`, and on stdin when `task_input="stdin"`;
- **launch**: `command`, bash run in the task's working directory.

Templates (`files` contents, `model_url_env` values, `env` values) are filled in with

| placeholder | |
|---|---|
| `{base_url}` | the rollout's model endpoint, `.../r/<rollout>/v1` (known only in the sandbox: the relay picks its port) |
| `{root}` | the same without the trailing `/v1` (what Anthropic-style clients want) |
| `{model}` | the model name to ask for |
| `{harness_dir}` | the harness's scratch folder (outside the repository) |
| `{venv}`, `{npm}` | the harness's venv and npm prefix |

and the command sees these variables:

| variable | |
|---|---|
| `OPENAI_BASE_URL`, `OPENAI_API_BASE` | the rollout's model endpoint (the recording proxy) |
| `OPENAI_API_KEY` | the rollout's token |
| `ORCHARD_MODEL` | the model name to ask for |
| `ORCHARD_MAX_STEPS` | the env's `max_steps` (model calls it answers; a harness may stop itself there) |
| `ORCHARD_TASK_FILE` | a file holding the task text |
| `ORCHARD_HARNESS_DIR` | the scratch folder (logs, the harness's own trajectory, its config) |
| `ORCHARD_HARNESS_VENV` | the harness's venv (when it has requirements) |
| `ORCHARD_HARNESS_NPM` | the harness's npm prefix (when it has npm packages; `.../node_modules/.bin` is on PATH) |

It runs with the task's environment (e.g. PATH with the task's test venv first), so the
commands it runs see what the task env's tools see. The built-in harnesses are one
module each in `wrappers/harness/plugins/` (see docs/harnesses.md).
"""

from __future__ import annotations

import importlib
import pkgutil
import shlex
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_SANDBOX_SIDE = {"{base_url}": "@ORCHARD_BASE_URL@", "{root}": "@ORCHARD_MODEL_ROOT@"}


class Harness(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    command: str = Field(min_length=1, description="bash that starts the harness (see the module docstring)")
    requirements: list[str] = Field(default_factory=list, description="pip requirements of its venv (pinned)")
    python: str | None = Field(None, pattern=r"^3\.\d+$", description="X.Y: build the venv on Debian's pythonX.Y, "
                               "bundled in it (harness/python.py), not on the host's interpreter")
    npm: list[str] = Field(default_factory=list, description="npm packages, pinned: name@X.Y.Z")
    files: dict[str, str] = Field(default_factory=dict, description="path under the harness dir -> template")
    model_url_env: dict[str, str] = Field(default_factory=dict, description="more variables holding the model "
                                          "URL, name -> template ('{base_url}' or '{root}')")
    task_input: Literal["file", "stdin"] = Field("file", description="stdin: the task text is also its stdin")
    env: dict[str, str] = Field(default_factory=dict, description="more environment (templates, host-side "
                                "placeholders only: {harness_dir} {venv} {npm} {model})")
    ok_exit_codes: list[int] = Field([0], description="exit codes of a run that ended normally")
    sandbox_payload: list[str] = Field(default_factory=list, description="paths under its npm prefix shipped "
                                       "into sandboxes that cannot see the host (docker, kubernetes)")
    shell_tool: str = Field("bash", description="its tool that runs a shell command (scripted policies use it)")
    shell_argument: str = Field("command", description="that tool's argument holding the command")
    finish: str | dict = Field("Done.", description="an answer that ends its run (text, or a tool call)")

    @field_validator("npm")
    @classmethod
    def _pinned(cls, v: list[str]) -> list[str]:
        from .install import check_npm_pins

        return check_npm_pins(v)

    @field_validator("files")
    @classmethod
    def _relative(cls, v: dict[str, str]) -> dict[str, str]:
        for path in v:
            p = PurePosixPath(path)
            if not path or p.is_absolute() or ".." in p.parts:
                raise ValueError(f"file {path!r} must be a relative path inside the harness dir")
        return v

    @field_validator("model_url_env")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not name.isidentifier():
                raise ValueError(f"{name!r} is not an environment variable name")
        return v

    def shell(self, command: str) -> dict:
        """The action (a tool call) that has the harness run `command` in its shell."""
        return {"name": self.shell_tool, "arguments": {self.shell_argument: command}}

    # ------------------------------------------------------------------ install (host)
    def install(self) -> Path | None:
        """Build (once, cached, under a lock) the venv with `requirements`; None if it has none."""
        if not self.requirements:
            return None
        if self.python:
            from .python import ensure_portable_venv

            return ensure_portable_venv(self.requirements, self.python)
        from orchard_gym.envs.swe.venvs import cache_root, ensure_venv

        return ensure_venv(self.requirements, root=cache_root() / "harness" / "venvs")

    def install_npm(self) -> Path | None:
        """Install (once, cached) the npm packages; their prefix, or None if it has none."""
        if not self.npm:
            return None
        from .install import ensure_npm

        return ensure_npm(self.npm)

    # ------------------------------------------------------------------ launch (sandbox)
    def task_text(self, env: Any, task: Any) -> str:
        """What the harness is asked to do: the issue text where the task has one, else the
        task env's first observation."""
        text = getattr(task, "problem_statement", None)
        return text.strip() if isinstance(text, str) and text.strip() else env.first_observation(task)

    def _host_fill(self, text: str, values: dict[str, str]) -> str:
        for key, value in values.items():
            text = text.replace("{" + key + "}", value)
        return text

    def environment(self, harness_dir: str, venv: str | None, npm: str | None = None,
                    model: str = "") -> dict[str, str]:
        values = {"harness_dir": harness_dir, "venv": venv or "", "npm": npm or "", "model": model}
        return {k: self._host_fill(v, values) for k, v in self.env.items()}

    def rendered_files(self, harness_dir: str, venv: str | None, npm: str | None, model: str) -> dict[str, str]:
        """`files` with the host-side placeholders filled in; `{base_url}`/`{root}` become
        markers the launch script replaces inside the sandbox."""
        values = {"harness_dir": harness_dir, "venv": venv or "", "npm": npm or "", "model": model}
        out = {}
        for path, template in self.files.items():
            for placeholder, marker in _SANDBOX_SIDE.items():
                template = template.replace(placeholder, marker)
            out[path] = self._host_fill(template, values)
        return out

    def launch_script(self, harness_dir: str, npm: str | None = None, payload: str | None = None,
                      venv: ShippedVenv | None = None) -> str:
        """run.sh: unpack a shipped payload (into `npm`) and a shipped venv, export the model-URL
        variables, write the config files (templates were uploaded to `<harness_dir>/templates/<i>`),
        then the command."""
        q = shlex.quote
        lines = ['export ORCHARD_MODEL_ROOT="${OPENAI_BASE_URL%/v1}"']
        if payload and npm:
            lines.append(f"mkdir -p {q(npm)} && tar -xzf {q(payload)} -C {q(npm)} && rm -f {q(payload)} || exit 96")
        if venv is not None:
            lines.append(venv.relink_script(self.name))
        if npm:
            lines.append(f'export ORCHARD_HARNESS_NPM={q(npm)} PATH={q(npm + "/node_modules/.bin")}:"$PATH"')
        for name, template in self.model_url_env.items():
            value = shlex.quote(template).replace("{base_url}", "'\"$OPENAI_BASE_URL\"'").replace(
                "{root}", "'\"$ORCHARD_MODEL_ROOT\"'")
            lines.append(f"export {name}={value}")
        for i, path in enumerate(self.files):
            target = f"{harness_dir}/{path}"
            lines.append(f"mkdir -p {q(str(PurePosixPath(target).parent))} && sed -e \"s|@ORCHARD_BASE_URL@|"
                         f"$OPENAI_BASE_URL|g; s|@ORCHARD_MODEL_ROOT@|$ORCHARD_MODEL_ROOT|g\" "
                         f"{q(f'{harness_dir}/templates/{i}')} > {q(target)} || exit 97")
        command = self.command
        if self.task_input == "stdin":
            command = f"{{\n{command}\n}} < \"$ORCHARD_TASK_FILE\""
        return "\n".join(lines) + "\n" + command + "\n"


class ShippedVenv(BaseModel):
    """A harness venv built on the host, shipped as an archive into a sandbox that cannot
    see the host (docker, kubernetes) and made to work there. A venv is its pyvenv.cfg
    (`home` = the base interpreter's folder), `bin/python*` links to that interpreter and
    scripts whose `#!` names the venv's own python: unpacked at `path`, the links are
    pointed at the sandbox's own pythonX.Y (the same X.Y: compiled wheels are per X.Y) and
    the `#!` lines rewritten from `host_path` to `path`. A venv that bundles its interpreter
    (`Harness.python`, `<venv>/runtime`) is relinked to that one first."""

    model_config = ConfigDict(extra="forbid")

    path: str
    archive: str | None = None  # None: already unpacked at `path` (a baked image, baked.py)
    host_path: str
    python: str = Field(pattern=r"^3\.\d+$")

    def relink_script(self, harness: str) -> str:
        q, v, exe = shlex.quote, shlex.quote(self.path), f"python{self.python}"
        why = f"orchard: the sandbox has no {exe} to run {harness}'s venv (built with python {self.python})"
        probe = ("import os, sys; print(os.path.realpath(getattr(sys, '_base_executable', sys.executable)) "
                 f"if '%d.%d' % sys.version_info[:2] == '{self.python}' else '')")
        unpack = ([f"mkdir -p {v} && tar -xzf {q(self.archive)} -C {v} && rm -f {q(self.archive)} || exit 96"]
                  if self.archive else [])
        return "\n".join([
            *unpack,
            'ORCHARD_PY=""',
            f'for c in {v}/runtime/bin/{exe} "$(command -v {exe})" /usr/bin/{exe} /usr/local/bin/{exe}; do',
            # the interpreter says where its base executable is (a task venv's python, a shim: not that)
            f'  [ -n "$c" ] && [ -x "$c" ] && ORCHARD_PY="$("$c" -I -c {q(probe)} 2>/dev/null)" && '
            '[ -n "$ORCHARD_PY" ] && break',
            "done",
            f'[ -n "$ORCHARD_PY" ] || {{ echo {q(why)} >&2; exit 95; }}',
            f'for f in {v}/bin/*; do [ -f "$f" ] && [ ! -L "$f" ] && '
            f'sed -i "1s|^#!{self.host_path}/bin/|#!{self.path}/bin/|" "$f"; done',
            f'ln -sfn "$ORCHARD_PY" {v}/bin/python && ln -sfn python {v}/bin/python3 && ln -sfn python {v}/bin/{exe}',
            f"printf 'home = %s\\ninclude-system-site-packages = false\\nversion = {self.python}\\n' "
            f'"$(dirname "$ORCHARD_PY")" > {v}/pyvenv.cfg || exit 96',
            f"export ORCHARD_HARNESS_VENV={v}",
        ])


def get_harness(spec: str | dict | Harness) -> Harness:
    """A harness by name ('mini-swe-agent', 'codex'), from a dict, or as given."""
    if isinstance(spec, Harness):
        return spec
    if isinstance(spec, dict):
        return Harness.model_validate(spec)
    harnesses = all_harnesses()
    if not isinstance(spec, str) or spec not in harnesses:
        raise ValueError(f"unknown harness {spec!r}; known: {sorted(harnesses)} (or pass a Harness)")
    return harnesses[spec]


# The built-in harnesses are plugins, one module each in wrappers/harness/plugins/, found by file name:
# they import this module (for `Harness`), never the other way round.
HARNESS_PACKAGE = f"{__name__.rpartition('.')[0]}.plugins"


def all_harnesses() -> dict[str, Harness]:
    """The built-in harnesses by name: every module of `HARNESS_PACKAGE` that defines `HARNESS`."""
    package = importlib.import_module(HARNESS_PACKAGE)
    found: dict[str, Harness] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        harness = getattr(importlib.import_module(f"{HARNESS_PACKAGE}.{info.name}"), "HARNESS", None)
        if isinstance(harness, Harness):
            found[harness.name] = harness
    return found


def __getattr__(name: str):  # the old module-level names, now in wrappers/harness/plugins/
    if name == "MINI_SWE_AGENT":
        return all_harnesses()["mini-swe-agent"]
    if name == "MINI_SWE_AGENT_VERSION":
        return importlib.import_module(f"{HARNESS_PACKAGE}.mini_swe_agent").VERSION
    if name == "HARNESSES":
        return all_harnesses()
    raise AttributeError(name)
