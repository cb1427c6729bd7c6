"""`orchard eval --harness NAME[,NAME...]`: the harness side of `orchard eval` (cli.py hands
over here when --harness is given). See docs/harnesses.md."""

from __future__ import annotations

import time

import click


def harness_names(value: str) -> list[str]:
    """'a,b,c' -> ['a', 'b', 'c'], each a known harness."""
    from orchard_gym.wrappers.harness import all_harnesses

    names = [n.strip() for n in value.split(",") if n.strip()]
    known = all_harnesses()
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise click.BadParameter(f"unknown harness(es) {unknown or [value]}; known: {', '.join(sorted(known))}",
                                 param_hint="--harness")
    if len(set(names)) != len(names):
        raise click.BadParameter("a harness is named twice", param_hint="--harness")
    return names


def eval_harnesses(*, harness: str, env_id: str, tasks: str, policy: str, backend_kwargs: dict,
                   model_api_key: str | None, episodes: int | None, attempts: int, concurrency: int,
                   max_steps: int, task_filter: tuple, out: str | None, max_seconds: float = 900.0,
                   price=None, max_error_rate: float | None = None) -> None:
    import gymnasium as gym

    from orchard_gym.wrappers.harness_eval import evaluate_harnesses, format_table, policy_from_spec

    import orchard_gym  # noqa: F401 - registers the env ids
    from orchard_gym.registration import list_task_ids

    names = harness_names(harness)
    try:
        agent = policy_from_spec(policy, api_key=model_api_key)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--policy") from None
    try:
        gym.spec(env_id)  # an unknown id is said here
    except gym.error.Error as e:
        raise click.BadParameter(str(e), param_hint="--env") from None
    ids = [t for t in list_task_ids(env_id, tasks=tasks) if not task_filter or t in task_filter]  # no sandbox
    if task_filter and len(ids) != len(set(task_filter)):
        raise click.BadParameter(f"unknown task ids: {sorted(set(task_filter) - set(ids))}", param_hint="--task-id")
    ids = ids[:episodes] if episodes else ids
    out_path = out or f"runs/eval-harness-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
    started = time.monotonic()
    runs = evaluate_harnesses(names, env_id, ids, agent, client_kwargs=backend_kwargs, attempts=attempts,
                              concurrency=concurrency, max_steps=max_steps, max_seconds=max_seconds,
                              env_kwargs={"tasks": tasks}, out=out_path)
    click.echo(f"\n{env_id} · policy {policy} · {len(ids)} tasks × {attempts} · {len(runs)} runs in "
               f"{time.monotonic() - started:.1f}s")
    click.echo(format_table(runs))
    from orchard_gym.ledger import format_summary, summarize
    from orchard_gym.trajectory import Trajectory

    for name in names:  # each harness's cost ledger (docs/ledger.md)
        mine = [Trajectory.model_validate(r.trajectory) for r in runs if r.harness == name and r.trajectory]
        click.echo(f"{name} " + format_summary(summarize(mine, price)).replace("\n", f"\n{name} "))
    for r in runs:
        if r.error:
            click.echo(f"  ERROR {r.harness}/{r.task_id}: {r.error[:300]}")
    click.echo(f"runs (trajectories and every recorded call): {out_path}")
    from orchard_gym.cli_exit import exit_if_failed

    exit_if_failed(sum(1 for r in runs if r.error), len(runs), max_error_rate, next((r.error for r in runs if r.error), None))
