#!/usr/bin/env python3
"""Build the container images of SWE tasks, from scratch and without a registry.

    python scripts/build_swe_images.py [--tasks builtin] [--only ID ...] [--engine podman]

One base image (`localhost/orchard/swe-base`: the Debian image built by
scripts/build_test_images.sh, plus Python 3.11, git and an empty venv at /opt/venv),
then one image per task (its `image` field) with the task's test requirements in
/opt/venv. Wheels are downloaded on the host (whose pip knows how to reach the
package index) and installed offline in the build, so builds need no network.
The repository itself is not in the image: the env uploads it at reset, as on the
local backend. Idempotent: an image is rebuilt only when its inputs change (label).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BASE_IMAGE = "localhost/orchard/swe-base:latest"
ROOT_IMAGE = "localhost/orchard/bookworm:latest"
LABEL = "org.orchard-gym.inputs"
BASE_FILE = f"""\
FROM {ROOT_IMAGE}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
        python3 python3-venv git patch ca-certificates >/dev/null && rm -rf /var/lib/apt/lists/* \\
    && python3 -m venv /opt/venv
WORKDIR /workspace
"""
TASK_FILE = """\
FROM {base}
COPY wheels /tmp/wheels
RUN /opt/venv/bin/pip install -q --no-index --find-links /tmp/wheels {requirements} && rm -rf /tmp/wheels
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL {label}={digest}
"""


def image_label(engine: str, image: str) -> str | None:
    r = subprocess.run([engine, "image", "inspect", "--format", f'{{{{index .Labels "{LABEL}"}}}}', image],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def build(engine: str, tag: str, containerfile: str, context: Path, digest: str) -> None:
    (context / "Containerfile").write_text(containerfile)
    cmd = [engine, "build", "-q", "--label", f"{LABEL}={digest}", "-t", tag, "-f", str(context / "Containerfile"),
           str(context)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"building {tag} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")


def ensure_base(engine: str) -> str:
    digest = hashlib.sha256(BASE_FILE.encode()).hexdigest()[:16]
    if image_label(engine, BASE_IMAGE) == digest:
        print(f"[swe-images] {BASE_IMAGE} up to date")
        return digest
    print(f"[swe-images] building {BASE_IMAGE} (apt: python3, git)", flush=True)
    with tempfile.TemporaryDirectory() as ctx:
        build(engine, BASE_IMAGE, BASE_FILE, Path(ctx), digest)
    return digest


def ensure_task_image(engine: str, image: str, requirements: list[str], base_digest: str) -> None:
    digest = hashlib.sha256("\n".join([base_digest, *sorted(requirements)]).encode()).hexdigest()[:16]
    if image_label(engine, image) == digest:
        print(f"[swe-images] {image} up to date")
        return
    print(f"[swe-images] building {image} ({' '.join(requirements) or 'no requirements'})", flush=True)
    with tempfile.TemporaryDirectory() as ctx:
        wheels = Path(ctx) / "wheels"
        wheels.mkdir()
        if requirements:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d",
                                str(wheels), *requirements], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"downloading wheels for {image} failed:\n{r.stderr[-3000:]}")
        quoted = " ".join(f"'{r}'" for r in requirements) or "--help >/dev/null"
        build(engine, image, TASK_FILE.format(base=BASE_IMAGE, requirements=quoted, label=LABEL, digest=digest),
              Path(ctx), digest)


def main() -> None:
    from orchard_gym.envs.swe.tasks import load_tasks

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="builtin", help="'builtin', a JSON/JSONL file or a folder")
    p.add_argument("--only", nargs="*", default=None, help="instance ids to build (default: all)")
    p.add_argument("--engine", default="podman", help="podman or docker CLI")
    args = p.parse_args()
    tasks = load_tasks(args.tasks)
    chosen = [tasks[i] for i in args.only] if args.only else list(tasks.values())
    base_digest = ensure_base(args.engine)
    seen: dict[str, list[str]] = {}
    for task in chosen:
        if not task.image:
            raise SystemExit(f"task {task.instance_id} names no image")
        if seen.get(task.image, task.install) != task.install:
            raise SystemExit(f"tasks sharing image {task.image} need different requirements")
        if task.image not in seen:
            ensure_task_image(args.engine, task.image, task.install, base_digest)
        seen[task.image] = task.install
    print(f"[swe-images] {len(seen)} task image(s) ready")


if __name__ == "__main__":
    main()
