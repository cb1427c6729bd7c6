"""`orchard tasks ...`: SWE task files (checking a file before training on it)."""

from __future__ import annotations

import click


@click.group("tasks")
def tasks_group() -> None:
    """SWE task files: SWE-bench-style JSON/JSONL/Parquet records, `datasets` folders."""


@tasks_group.command("check")
@click.argument("source")
@click.option("--split", default=None, help="split of a datasets folder or hub dataset")
@click.option("--dataset", default=None, help="force a record schema (swe-bench, swe-gym, swe-rebench, r2e-gym, "
                                              "swe-smith, orchard)")
@click.option("--strict", is_flag=True, help="warnings fail too (exit status 1)")
def check_cmd(source, split, dataset, strict) -> None:
    """Validate a task file and warn about what silently breaks grading (Harbor task folders too:
    each task that cannot run is listed with its reason).

    Example: orchard tasks check my_tasks.jsonl; orchard tasks check path/to/harbor-tasks
    """
    from orchard_gym.envs.harbor.tasks import looks_like_harbor

    if looks_like_harbor(source):
        return _check_harbor(source, strict)
    from orchard_gym.envs.swe.task_check import check_tasks

    count, problems = check_tasks(source, split, dataset)
    for p in problems:
        click.echo(str(p), err=p.severity == "error")
    errors = sum(p.severity == "error" for p in problems)
    warnings = len(problems) - errors
    click.echo(f"{count} task(s) read: {errors} error(s), {warnings} warning(s)")
    if errors or (strict and warnings):
        raise SystemExit(1)


def _check_harbor(source: str, strict: bool) -> None:
    from orchard_gym.envs.harbor.tasks import load_tasks

    try:
        tasks, problems = load_tasks(source)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="SOURCE") from None
    for p in problems:
        click.echo(str(p), err=p.severity == "error")
    errors = sum(p.severity == "error" for p in problems)
    click.echo(f"{len(tasks)} Harbor task(s) can run; {errors} skipped (error), "
               f"{len(problems) - errors} warning(s)")
    if errors or (strict and len(problems) > errors):
        raise SystemExit(1)
