"""`orchard eval --harness NAME[,NAME...]`: the harness side of `orchard eval` (commands.py hands
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


def named_pairs(value: str | None, option: str) -> dict[str, str]:
    """'a=x,b=y' -> {'a': 'x', 'b': 'y'}: names unique and non-empty, each with a value."""
    pairs: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        name, sep, spec = item.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep or not name or not spec:
            raise click.BadParameter(f"{item.strip()!r} is not NAME=VALUE", param_hint=option)
        if name in pairs:
            raise click.BadParameter(f"{name!r} is named twice", param_hint=option)
        pairs[name] = spec
    if value is not None and not pairs:
        raise click.BadParameter("nothing given (NAME=VALUE,...)", param_hint=option)
    return pairs


def eval_harnesses(*, harness: str, env_id: str, tasks: str, policy: str, backend_kwargs: dict,
                   model_api_key: str | None, episodes: int | None, attempts: int, concurrency: int,
                   max_steps: int, task_filter: tuple, out: str | None, max_seconds: float = 900.0,
                   price=None, max_error_rate: float | None = None, policies: str | None = None,
                   train_harness: str | None = None) -> None:
    import gymnasium as gym

    from orchard_gym.wrappers.harness import all_harnesses
    from orchard_gym.wrappers.harness.eval import (evaluate_harnesses, evaluate_matrix, format_matrix, format_table,
                                                   policy_from_spec)

    import orchard_gym  # noqa: F401 - registers the env ids
    from orchard_gym.registration import list_task_ids

    names = harness_names(harness)
    if train_harness is not None and policies is None:
        raise click.UsageError("--train-harness labels the models of --policies; give --policies too")
    specs = named_pairs(policies, "--policies") if policies is not None else {"": policy}
    trained = named_pairs(train_harness, "--train-harness")
    if set(trained) - set(specs):
        raise click.BadParameter(f"names no policy of --policies: {sorted(set(trained) - set(specs))}",
                                 param_hint="--train-harness")
    if set(trained.values()) - set(all_harnesses()):
        raise click.BadParameter(f"unknown harness(es) {sorted(set(trained.values()) - set(all_harnesses()))}; "
                                 f"known: {', '.join(sorted(all_harnesses()))}", param_hint="--train-harness")
    agents = {}
    for name, spec in specs.items():
        try:
            agents[name] = policy_from_spec(spec, api_key=model_api_key)
        except ValueError as e:
            raise click.BadParameter(f"{name + ': ' if name else ''}{e}",
                                     param_hint="--policies" if name else "--policy") from None
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
    common = dict(client_kwargs=backend_kwargs, attempts=attempts, concurrency=concurrency, max_steps=max_steps,
                  max_seconds=max_seconds, env_kwargs={"tasks": tasks}, out=out_path)
    if policies is None:
        runs = evaluate_harnesses(names, env_id, ids, agents[""], **common)
    else:
        runs = evaluate_matrix(names, env_id, ids, agents, train_harness=trained, **common)
    said = policy if policies is None else f"{len(agents)} policies"
    click.echo(f"\n{env_id} · policy {said} · {len(ids)} tasks × {attempts} · {len(runs)} runs in "
               f"{time.monotonic() - started:.1f}s")
    click.echo(format_table(runs) if policies is None else format_matrix(runs))
    from orchard_gym.ledger import format_summary, summarize
    from orchard_gym.trajectory import Trajectory

    for name in names:  # each harness's cost ledger (docs/ledger.md)
        mine = [Trajectory.model_validate(r.trajectory) for r in runs if r.harness == name and r.trajectory]
        click.echo(f"{name} " + format_summary(summarize(mine, price)).replace("\n", f"\n{name} "))
    for r in runs:
        if r.error:
            click.echo(f"  ERROR {r.harness}/{r.task_id}: {r.error[:300]}")
    click.echo(f"runs (trajectories and every recorded call): {out_path}")
    from orchard_gym.cli.exit import exit_if_failed

    exit_if_failed(sum(1 for r in runs if r.error), len(runs), max_error_rate, next((r.error for r in runs if r.error), None))
