#!/usr/bin/env python3
"""Built-in SWE tasks as SWE-bench instances: records plus images in SWE-bench's layout.

    python scripts/build_swebench_layout_images.py [--only ID ...] [--engine podman] [--records OUT.jsonl]

For each chosen built-in task (default: semver-3.0.2, the one CI grades) this writes
the task as a SWE-bench 5 record (`to_swebench_record`: instance_id `owner__repo-N`,
`base_commit`, JSON-string FAIL_TO_PASS/PASS_TO_PASS, `eval_script`, `log_parser`,
`eval_type`; no `image` field, so the loader derives SWE-bench's image name) and builds
`localhost/orchard/sweb.eval.x86_64.<id, __ -> _1776_>:latest` the way SWE-bench's
instance images are laid out:

- the repository at `/testbed` (a git repo at `base_commit`), the image's working dir;
- `/opt/miniconda3/bin/activate` and `/opt/miniconda3/bin/conda`: a stand-in for conda
  that the eval script sources and calls (`source /opt/miniconda3/bin/activate`,
  `conda activate testbed`), with a real venv behind `/opt/miniconda3/envs/testbed`
  (the task's own image's `/opt/venv`, holding its test requirements);
- PATH without that venv: only the activation puts Python's test environment on it.

No network: it starts from the per-task images of scripts/build_swe_images.py. The
base commit is made with fixed names and dates, so its hash is the same on every build.
Idempotent: an image is rebuilt only when its inputs change (label).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PREFIX = "localhost/orchard"
DEFAULT_TASKS = ["semver-3.0.2"]
LABEL = "org.orchard-gym.inputs"
GIT_ENV = {"GIT_AUTHOR_NAME": "orchard", "GIT_AUTHOR_EMAIL": "orchard@localhost", "GIT_COMMITTER_NAME": "orchard",
           "GIT_COMMITTER_EMAIL": "orchard@localhost", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_CONFIG_NOSYSTEM": "1"}
# conda's activate, as far as SWE-bench's eval scripts use it: `source activate` puts
# /opt/miniconda3/bin on PATH and defines the `conda` shell function; `conda activate NAME`
# puts /opt/miniconda3/envs/NAME/bin first. Safe under `set -u`.
ACTIVATE = """\
# orchard-gym test stand-in for conda's bin/activate (scripts/build_swebench_layout_images.py)
conda() {
    if [ "${1:-}" = activate ]; then
        _orchard_env="${2:-base}"
        if [ "$_orchard_env" = base ]; then return 0; fi
        if [ ! -d "/opt/miniconda3/envs/$_orchard_env" ]; then
            echo "EnvironmentNameNotFound: Could not find conda environment: $_orchard_env" >&2
            return 1
        fi
        PATH="/opt/miniconda3/envs/$_orchard_env/bin:$PATH"
        CONDA_DEFAULT_ENV="$_orchard_env"; CONDA_PREFIX="/opt/miniconda3/envs/$_orchard_env"
        export PATH CONDA_DEFAULT_ENV CONDA_PREFIX
        return 0
    fi
    /opt/miniconda3/bin/conda "$@"
}
case ":$PATH:" in *:/opt/miniconda3/bin:*) ;; *) PATH="/opt/miniconda3/bin:$PATH"; export PATH ;; esac
if [ -n "${1:-}" ]; then conda activate "$1"; fi
"""
CONDA = """\
#!/bin/sh
# orchard-gym test stand-in for the conda executable
case "${1:-}" in
    --version) echo "conda 23.11.0" ;;
    env) [ "${2:-}" = list ] && { echo "base  /opt/miniconda3"; echo "testbed  /opt/miniconda3/envs/testbed"; } ;;
    activate|deactivate) echo "conda $1: source /opt/miniconda3/bin/activate first" >&2; exit 1 ;;
    *) echo "conda (orchard-gym stand-in): $* is not supported" >&2; exit 1 ;;
esac
"""
CONTAINERFILE = """\
FROM {base}
COPY miniconda3 /opt/miniconda3
RUN chmod 755 /opt/miniconda3/bin/conda && mkdir -p /opt/miniconda3/envs \\
    && ln -s /opt/venv /opt/miniconda3/envs/testbed
COPY testbed /testbed
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /testbed
"""


def instance_id(task) -> str:
    """SWE-bench's `owner__repo-NUMBER` form (the release's digits stand in for a PR number)."""
    return f"{task.repo.replace('/', '__')}-{task.instance_id.rsplit('-', 1)[-1].replace('.', '')}"


def image_name(iid: str) -> str:
    from orchard_gym.envs.swe.datasets import swebench_image, with_prefix

    return with_prefix(swebench_image(iid), PREFIX)


def make_testbed(task, dest: Path) -> str:
    """Extract the task's base tree into `dest` as a git repository; return its commit."""
    dest.mkdir(parents=True)
    with tarfile.open(task.source_archive) as tar:
        tar.extractall(dest, filter="data")
    env = {**os.environ, **GIT_ENV}
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A", "-f"], ["git", "commit", "-qm", "base"]):
        subprocess.run(cmd, cwd=dest, env=env, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=dest, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def to_swebench_record(task, base_commit: str) -> dict:
    """`task` (a built-in task) as the record a SWE-bench 5 dataset publishes."""
    from orchard_gym.envs.swe.image_eval import eval_script_for

    iid = instance_id(task)
    as_image_task = task.model_copy(update={"instance_id": iid, "base_commit": base_commit, "workdir": "/testbed"})
    return {
        "instance_id": iid, "repo": task.repo, "base_commit": base_commit, "patch": task.patch,
        "test_patch": task.test_patch, "problem_statement": task.problem_statement, "hints_text": task.hints_text,
        "created_at": task.model_extra.get("created_at", ""), "version": task.version or "",
        "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS), "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
        "environment_setup_commit": base_commit, "eval_script": eval_script_for(as_image_task),
        "log_parser": task.log_parser, "eval_type": task.eval_type,
    }


def records(task_ids: list[str]) -> list[dict]:
    """The SWE-bench records of `task_ids` (no image is built; the base commits are computed)."""
    from orchard_gym.envs.swe.tasks import load_tasks

    tasks = load_tasks("builtin")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for tid in task_ids:
            out.append(to_swebench_record(tasks[tid], make_testbed(tasks[tid], Path(tmp) / tid)))
    return out


def _label(engine: str, image: str) -> str | None:
    r = subprocess.run([engine, "image", "inspect", "--format", f'{{{{index .Labels "{LABEL}"}}}}', image],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def ensure_image(engine: str, task) -> str:
    iid = instance_id(task)
    tag = image_name(iid)
    base_id = subprocess.run([engine, "image", "inspect", "--format", "{{.Id}}", task.image], capture_output=True,
                             text=True)
    if base_id.returncode != 0:
        raise SystemExit(f"{task.image} is missing: run scripts/build_swe_images.py first")
    digest = hashlib.sha256("\n".join([base_id.stdout.strip(), hashlib.sha256(task.source_archive.read_bytes())
                                       .hexdigest(), ACTIVATE, CONDA, CONTAINERFILE]).encode()).hexdigest()[:16]
    if _label(engine, tag) == digest:
        print(f"[swebench-layout] {tag} up to date")
        return tag
    print(f"[swebench-layout] building {tag} from {task.image}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Path(tmp)
        make_testbed(task, ctx / "testbed")
        (ctx / "miniconda3" / "bin").mkdir(parents=True)
        (ctx / "miniconda3" / "bin" / "activate").write_text(ACTIVATE)
        (ctx / "miniconda3" / "bin" / "conda").write_text(CONDA)
        (ctx / "Containerfile").write_text(CONTAINERFILE.format(base=task.image))
        r = subprocess.run([engine, "build", "-q", "--label", f"{LABEL}={digest}", "-t", tag, "-f",
                            str(ctx / "Containerfile"), str(ctx)], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"building {tag} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return tag


def main() -> None:
    from orchard_gym.envs.swe.tasks import load_tasks

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=DEFAULT_TASKS, help="built-in task ids")
    p.add_argument("--engine", default="podman", help="podman or docker CLI")
    p.add_argument("--records", type=Path, help="also write the SWE-bench records to this JSONL file")
    args = p.parse_args()
    tasks = load_tasks("builtin")
    for tid in args.only:
        ensure_image(args.engine, tasks[tid])
    if args.records:
        args.records.write_text("".join(json.dumps(r) + "\n" for r in records(args.only)))
        print(f"[swebench-layout] {len(args.only)} record(s) in {args.records}")


if __name__ == "__main__":
    main()
