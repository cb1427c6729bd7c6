"""Orchard/GUI-v0 on the kubernetes backend, against tests/fake_k8s (a real-wire-protocol API
server whose kubelet runs the pods with Podman): one MiniWoB task and one desktop task, each
solved by its oracle in scripts/build_gui_image.sh's image.

    export "$(bash scripts/podman_service.sh start)"
    python scripts/demo_gui_k8s.py            # needs the k8s extra and localhost/orchard/gui

The pod runs the GUI image with the agent injected; the env reaches the GUI daemon through the
relay (a command run by the agent, the frame downloaded), exactly as on docker.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import orchard_gym  # noqa: F401
from fake_k8s import FakeCluster
from orchard_gym._loop import LoopThread
from orchard_gym.envs.rollout import run_episode

CASES = [("miniwob/click-button", "miniwob"), ("desktop/editor-replace", "desktop")]


def main() -> int:
    workdir = tempfile.mkdtemp(prefix="gui-k8s-")
    cluster = FakeCluster(workdir, kubelet="podman")
    failed = 0
    try:
        for task_id, tasks in CASES:
            e = gym.make("Orchard/GUI-v0", backend=cluster.backend_config(), tasks=tasks, max_steps=20)
            env = e.unwrapped
            started = time.monotonic()
            try:
                obs, _ = e.reset(seed=0, options={"task_id": task_id})
                reset = time.monotonic() - started
                colours = len(np.unique(obs["screenshot"][:210, :400].reshape(-1, 3), axis=0))
                trajectory = LoopThread.shared().run(run_episode(env, env.oracle_policy(), task_id, seed=7))
            finally:
                e.close()
            ok = trajectory.error is None and trajectory.reward == 1.0
            failed += not ok
            print(json.dumps({"task": task_id, "backend": "kubernetes (fake API server, Podman kubelet)",
                              "reward": trajectory.reward, "error": trajectory.error, "first_reset_s": round(reset, 1),
                              "episode_s": round(time.monotonic() - started - reset, 1),
                              "screen_colours": colours, "steps": trajectory.steps}), flush=True)
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
