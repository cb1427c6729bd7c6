"""Orchard envs in TRL's env slot: `GRPOTrainer(environment_factory=...)` (TRL 1.16).

    from orchard_gym.integrations.trl import environment_factory
    factory = environment_factory("Orchard/SWE-v0", backend={"type": "local"})
    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=factory.dataset(),
                          environment_factory=factory, callbacks=[factory.callback()])
    trainer.train()

What TRL gets (its contract, read from `GRPOTrainer.__init__` and `_tool_call_loop`):
- `factory()` builds one environment object per rollout; TRL pools and reuses them;
- `reset(**row)` starts the row's task (`row["task_id"]`, else one drawn with `row["seed"]`)
  and returns its first observation, which TRL appends to the row's last user message.
  Provisioning runs in the background, so TRL's serial resets start every sandbox at once;
- one public async method per tool of the env, its signature and docstring built from the
  tool's JSON schema, so TRL's tool loop renders them into the chat template and calls them;
  each call is one `env.step` and returns its observation;
- `get_reward()` ends the episode (a policy that stopped without calling `submit` is
  submitted for it, as the env's own step budget would) and returns the env's graded reward.

Errors are never silent zeros. An episode whose sandbox died, could not be provisioned or
whose task could not be graded returns `None` from `get_reward`: TRL turns that into NaN,
marks a rollout with no other reward "unscorable" (excluded from the group baseline, zero
advantage) and logs a warning with the row. Each such outcome is also kept in
`factory.errors` and logged by this module, so a run can count or stop on them.

Sandboxes: all instances of one factory share one sandbox client (warm pools included); an
episode's sandbox is deleted right after `get_reward` grades it, again on the next
`reset`, and every one left at `factory.close()` (the `factory.callback()` calls it when
training ends, and at interpreter exit as a last resort).

Image envs (GUI): TRL 1.16 takes a tool result, and `reset`'s return, as a list of content
blocks, and hands its `{"type": "image", "image": PIL.Image}` blocks to a vision-language
model (`_tool_call_loop`: `tool_images`). So a GUI environment's `reset` waits for its sandbox
and returns the first screen as `[image, text]`, and every tool call returns the next screen
the same way (errors stay text). It needs a vision-language `processing_class`.

A dict of factories (`{"swe": environment_factory("Orchard/SWE-v0"), "toy": ...}`) is TRL's
mixed run: `build_dataset(that_dict)` gives rows with the `environment` column TRL routes on.
"""

from __future__ import annotations

import atexit
import inspect
import json
import logging
import random
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from orchard_gym.screenshots import image_array

from .core import EnvHub, Episode, EpisodeOver, Outcome, observation_image, observation_text

log = logging.getLogger(__name__)
JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}
RESERVED = ("reset", "get_reward")  # TRL's own method names: never tools


class OrchardEnvironment:
    """Base of the per-env-id classes TRL sees. Public *functions* on these classes are tools
    (TRL lists them with `inspect.getmembers(type(env), inspect.isfunction)`), so everything
    else here is private or a property."""

    _factory: OrchardEnvironmentFactory

    def __init__(self) -> None:
        self._episode: Episode = self._factory.hub.episode()
        self._task_id: str | None = None

    def reset(self, task_id: str | None = None, seed: int | None = None, **row: Any) -> str | list[dict]:
        """Start the row's task; returns its first observation (appended to the prompt by TRL): the
        task text, or for an image env the first screen as content blocks (after the sandbox is up)."""
        hub = self._factory.hub
        if task_id is None:
            task_id = random.Random(seed).choice(hub.task_ids()) if seed is not None else \
                random.choice(hub.task_ids())
        prompt = hub.prompt(task_id)  # raises on an unknown task, before anything starts
        self._task_id = task_id
        self._episode.start_soon(task_id, seed)
        if hub.images:  # the first screen exists only once the sandbox is up: wait for it
            try:
                return trl_content(hub.run(self._episode.first_observation()))
            except EpisodeOver as e:  # not started: the episode is errored, get_reward gives None
                return str(e)
        return prompt

    async def get_reward(self) -> float | None:
        """The env's graded reward; None (TRL: unscorable, dropped) when the episode errored."""
        try:
            outcome = await self._factory.hub.arun(self._episode.finish())
        except EpisodeOver as e:  # reset was never called
            outcome = Outcome(None, str(e), "infrastructure")
        finally:
            await self._factory.hub.arun(self._episode.release())
        if outcome.error is not None:
            self._factory.record_error(self._task_id, outcome)
            return None
        return outcome.reward

    @property
    def trajectory(self):
        """The last episode's trajectory (actions, observations, reward, error)."""
        return self._episode.env.trajectory if self._episode.env is not None else None

    async def _call(self, tool: str, arguments: dict) -> str | list[dict]:
        try:
            return trl_content(await self._factory.hub.arun(self._episode.call(tool, arguments)))
        except EpisodeOver as e:
            return str(e)



def trl_content(obs: Any) -> str | list[dict]:
    """An observation as TRL takes a tool result: text, or `[image block, text block]` (a PIL image)."""
    image = observation_image(obs)
    if image is None:
        return observation_text(obs)
    from PIL import Image

    screen = image_array(image)
    screen = screen[..., 0] if screen.shape[2] == 1 else screen
    return [{"type": "image", "image": Image.fromarray(screen)}, {"type": "text", "text": observation_text(obs)}]


def python_type(schema: dict) -> Any:
    """The annotation transformers' `get_json_schema` turns back into this JSON type."""
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]
        kinds = [JSON_TYPES.get(k) for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 and kinds[0] else Any
    if "anyOf" in schema:
        options = [python_type(s) for s in schema["anyOf"] if s.get("type") != "null"]
        return options[0] if len(options) == 1 else Any
    return JSON_TYPES.get(kind, Any)


def tool_method(schema: dict):
    """An async method for one tool: typed signature and Google docstring from its JSON schema."""
    fn = schema["function"]
    name = fn["name"]
    if not name.isidentifier() or name.startswith("_") or name in RESERVED:
        raise ValueError(f"tool {name!r} cannot be a TRL environment method (not an identifier, or reserved)")
    params = fn.get("parameters") or {}
    props, required = params.get("properties") or {}, set(params.get("required") or ())
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    arg_docs = []
    for arg, spec in sorted(props.items(), key=lambda kv: kv[0] not in required):  # required first
        if not arg.isidentifier():
            raise ValueError(f"argument {arg!r} of tool {name!r} is not a Python identifier")
        kind = python_type(spec)
        annotation = kind if arg in required else kind | None if kind is not Any else Any
        default = inspect.Parameter.empty if arg in required else spec.get("default")
        parameters.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotation))
        annotations[arg] = annotation
        text = " ".join((spec.get("description") or arg).split())
        if spec.get("enum"):
            text += f" (choices: {json.dumps(spec['enum'])})"
        arg_docs.append(f"    {arg}: {text}")
    annotations["return"] = str

    async def method(self, **arguments):
        return await self._call(name, {k: v for k, v in arguments.items() if v is not None or k in required})

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(parameters, return_annotation=str)
    method.__annotations__ = annotations
    description = " ".join((fn.get("description") or name).split())
    method.__doc__ = description + ("\n\nArgs:\n" + "\n".join(arg_docs) if arg_docs else "") + \
        "\n\nReturns:\n    The tool's output, as the env observes it (an image env: the screen and its text)."
    return method


def environment_class(factory: OrchardEnvironmentFactory) -> type[OrchardEnvironment]:
    """A class of its own per factory: TRL names the reward column after it and matches
    rollouts to it by exact type."""
    name = "Orchard" + re.sub(r"\W", "", factory.hub.env_id.split("/")[-1].replace("-", "_"))
    members: dict[str, Any] = {"_factory": factory, "__module__": __name__}
    for schema in factory.hub.tool_schemas:
        members[schema["function"]["name"]] = tool_method(schema)
    return type(name, (OrchardEnvironment,), members)


class OrchardEnvironmentFactory:
    """What `environment_factory(env_id)` returns: call it for an environment (TRL does)."""

    def __init__(self, env_id: str, **env_kwargs: Any):
        self.hub = EnvHub(env_id, **env_kwargs)
        self.env_class = environment_class(self)
        self.errors: list[tuple[str | None, Outcome]] = []
        self._lock = threading.Lock()
        atexit.register(_close_quietly, weakref.ref(self))

    def __call__(self) -> OrchardEnvironment:
        return self.env_class()

    def record_error(self, task_id: str | None, outcome: Outcome) -> None:
        with self._lock:
            self.errors.append((task_id, outcome))
        log.warning("%s task %s errored (%s): %s; its rollout is unscorable (get_reward -> None)",
                    self.hub.env_id, task_id, outcome.error_kind, outcome.error)

    def dataset(self, task_ids: Sequence[str] | None = None, *, repeat: int = 1, system_prompt: str | None = None):
        """TRL rows for this env (see `build_dataset`)."""
        return build_dataset(self, task_ids, repeat=repeat, system_prompt=system_prompt)

    def callback(self):
        """A transformers `TrainerCallback` that releases every sandbox when training ends."""
        from transformers import TrainerCallback

        factory = self

        class ReleaseSandboxes(TrainerCallback):
            def on_train_end(self, args, state, control, **kwargs):
                factory.close()

        return ReleaseSandboxes()

    def close(self) -> None:
        self.hub.close()


def _close_quietly(ref) -> None:
    factory = ref()
    if factory is not None:
        try:
            factory.close()
        except Exception:  # interpreter exit: best effort
            pass


def environment_factory(env_id: str, **env_kwargs: Any) -> OrchardEnvironmentFactory:
    """TRL's `environment_factory` for a registered Orchard env id; `env_kwargs` as `gym.make` takes
    them (`backend=`, `base_url=`, `pool=` build the client every instance shares)."""
    return OrchardEnvironmentFactory(env_id, **env_kwargs)


def build_dataset(factories: OrchardEnvironmentFactory | Mapping[str, OrchardEnvironmentFactory],
                  task_ids: Sequence[str] | Mapping[str, Sequence[str]] | None = None, *, repeat: int = 1,
                  system_prompt: str | None = None):
    """A `datasets.Dataset` of TRL rows: `prompt` (conversational; the task text is added by
    `reset`), `task_id` and, for a dict of factories, `environment` (TRL's routing column)."""
    from datasets import Dataset

    named = dict(factories) if isinstance(factories, Mapping) else {None: factories}
    rows = []
    for name, factory in named.items():
        ids = task_ids.get(name) if isinstance(task_ids, Mapping) else task_ids
        for task_id in (ids if ids is not None else factory.hub.task_ids()):
            factory.hub.check_task(task_id)
            prompt = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
                [{"role": "user", "content": ""}]
            row = {"prompt": prompt, "task_id": task_id}
            if name is not None:
                row["environment"] = name
            rows += [row] * repeat
    return Dataset.from_list(rows)


__all__ = ["OrchardEnvironment", "OrchardEnvironmentFactory", "build_dataset", "environment_factory"]
