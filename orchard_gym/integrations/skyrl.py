"""Orchard envs as SkyRL-Gym `BaseTextEnv`s, in SkyRL-Gym's own registry (`skyrl-gym` 0.4).

    import skyrl_gym
    from orchard_gym.integrations.skyrl import register_envs
    register_envs()                                   # "Orchard/SWE-v0", "Orchard/Claw-v0", ... in skyrl_gym
    env = skyrl_gym.make("Orchard/Claw-v0", env_config={"backend": {"type": "local"}},
                         extras={"task_id": "calendar-answer-001"})
    prompt, _ = env.init([])                          # the task as a user message (sandbox provisioned)
    out = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
    out["reward"], out["done"], out["observations"]   # the env's graded reward at the end
    env.close()                                       # deletes the sandbox

Actions are the model's text, parsed as Orchard parses any action (a `<tool_call>` block, a
JSON tool call, or one fenced bash block); a malformed one comes back as an observation
saying what was wrong. `env_config` holds `gym.make` kwargs (backend, max_steps, tasks...);
envs made with equal `env_config`s share one sandbox client. SkyRL's step output needs a
float reward: an errored episode (the sandbox died, the task could not be graded) ends with
reward 0.0 **and** `metadata["error"]`, and counts in `get_metrics()["errored"]`, so a
generator can drop it; never read its 0.0 as a grade.

Image envs (GUI) are refused (`ImagesNotCarried`, saying why): SkyRL-Gym 0.4's `BaseTextEnv`
observations are chat messages whose content is a string, which SkyRL's generator renders
with the chat template into text tokens; there is no place for a screenshot.
"""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from .core import EpisodeOver, carries_images, make_env, refuse_images, shared_hub

SLOT = "SkyRL-Gym 0.4's BaseTextEnv"
WHY = ("its observations are chat messages with string content, which SkyRL's generator renders into text "
       "tokens (BaseTextEnvStepOutput: observations=[{'role': 'user', 'content': str}])")


def _plain(config: Any) -> dict:
    if config is None:
        return {}
    try:  # SkyRL passes OmegaConf configs
        from omegaconf import OmegaConf

        if OmegaConf.is_config(config):
            return OmegaConf.to_container(config, resolve=True)
    except ImportError:
        pass
    return dict(config)


class OrchardTextEnv(BaseTextEnv):
    """One Orchard episode as a SkyRL text env: `init` provisions, `step` runs one action."""

    def __init__(self, env_config: Any = None, extras: dict | None = None, *, env_id: str):
        super().__init__()
        self.hub = shared_hub(env_id, _plain(env_config))
        if self.hub.images:
            raise refuse_images(env_id, SLOT, WHY)
        self.episode = self.hub.episode()
        self.extras = dict(extras or {})
        self.max_turns = self.hub.probe.max_steps
        self.errored = 0

    def init(self, prompt: list[dict]) -> tuple[list[dict], dict]:
        task_id, seed = self.extras.get("task_id"), self.extras.get("seed")
        if task_id is not None:
            self.hub.check_task(task_id)
        observation = self.hub.run(self.episode.start(task_id, seed))
        task = self.episode.env.trajectory.task_id
        return list(prompt or []) + [{"role": "user", "content": observation}], \
            {"task_id": task, "tools": self.hub.tool_schemas}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        try:
            text, reward, terminated, truncated, info = self.hub.run(self.episode.step(action))
        except EpisodeOver as e:
            return self._errored(str(e))
        done = terminated or truncated
        metadata = {"action_error": info.get("action_error")}
        if done:
            outcome = self.episode.outcome
            if outcome.error is not None:
                return self._errored(outcome.error, text)
            reward, metadata["report"] = outcome.reward, outcome.report
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": text}], reward=float(reward),
                                     done=done, metadata=metadata)

    def _errored(self, error: str, text: str | None = None) -> BaseTextEnvStepOutput:
        self.errored = 1
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": text or error}], reward=0.0,
                                     done=True, metadata={"error": error})

    def get_metrics(self) -> dict:
        return {"errored": self.errored, "steps": self.turns}

    def close(self) -> None:
        self.hub.run(self.episode.release())


def register_envs(env_ids: list[str] | None = None) -> list[str]:
    """Register Orchard env ids (default: every registered one but GUI's image observations)
    with SkyRL-Gym's registry under the same ids; returns them."""
    import skyrl_gym

    from orchard_gym.registration import ENVS

    ids = env_ids if env_ids is not None else [i for i in ENVS if i not in ("Orchard/GUI-v0", "Orchard/OpenEnv-v0")]
    for env_id in env_ids or ():  # asked for by name: an image env is refused here, not at the first make
        try:
            probe = make_env(env_id)
        except Exception:  # an env that needs kwargs to be made (e.g. OpenEnv-v0's url): checked at make
            continue
        if carries_images(probe):
            raise refuse_images(env_id, SLOT, WHY)
    for env_id in ids:
        if env_id not in skyrl_gym.registry:
            skyrl_gym.register(id=env_id, entry_point=f"{__name__}:OrchardTextEnv", kwargs={"env_id": env_id})
    return ids


__all__ = ["OrchardTextEnv", "register_envs"]
