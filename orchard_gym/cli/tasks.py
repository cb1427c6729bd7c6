"""`orchard tasks ...`: checking task files, exporting them as Harbor folders, synthesizing them."""

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


@tasks_group.command("push")
@click.argument("source")
@click.option("--registry", required=True, help="where the cluster pulls from: HOST[:PORT][/PATH], e.g. "
                                                "registry.example.com/team")
@click.option("--no-push", is_flag=True, help="build and tag only (push yourself, or the node's engine is this one)")
@click.option("--docker-url", default=None, help="the engine (default: $DOCKER_HOST, else the local socket)")
def push_cmd(source, registry, no_push, docker_url) -> None:
    """Build each Harbor task's environment/ (as the docker backend does: never pulling, cached
    by content hash) and push it as REGISTRY/orchard/harbor-NAME:HASH12: the name
    Orchard/Harbor-v0 runs on kubernetes with image_registry=REGISTRY. Tasks with only
    [environment] docker_image run that name as is. The engine's `docker login` is used.

    Example: orchard tasks push --registry registry.example.com/team path/to/harbor-tasks
    """
    from orchard_gym.backends.docker import default_base_url
    from orchard_gym.envs.harbor.images import check_registry, push_images
    from orchard_gym.envs.harbor.tasks import load_tasks

    try:
        check_registry(registry)
        tasks, problems = load_tasks(source)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    for p in problems:
        if p.severity == "error":
            click.echo(str(p), err=True)
    rows = push_images([tasks[t] for t in sorted(tasks)], registry, docker_url or default_base_url(),
                       push=not no_push)
    for row in rows:
        click.echo(f"{row['task_id']}\t{row['status']}\t{row['image']}")
    failed = sum(row["status"].startswith("failed") for row in rows)
    click.echo(f"{len(rows) - failed} of {len(rows)} task image(s) ready under {registry}; {failed} failed")
    if failed:
        raise SystemExit(1)


@tasks_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["harbor"]), default="harbor", show_default=True)
@click.option("--env", "env_id", default="Orchard/Toy-v0", show_default=True, help="registered env id")
@click.option("--env-kwargs", default="{}", show_default=True, help="env kwargs as JSON (e.g. its tasks)")
@click.option("--task-id", "task_ids", multiple=True, help="export only these tasks (repeatable; default: all)")
@click.option("--base-image", default=None,
              help="FROM of the Dockerfiles written [default: localhost/orchard/bookworm:latest; Claw: "
                   "localhost/orchard/swe-base:latest, which has python3]")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="folder for the task folders")
def export_cmd(fmt, env_id, env_kwargs, task_ids, base_image, out) -> None:
    """Write an env's tasks as Harbor task folders (Toy, SWE, Claw; a task that cannot be exported is
    listed with its reason and the exit status is 1).

    Example: orchard tasks export --format harbor --env Orchard/Claw-v0 --out harbor-claw
    """
    import json
    from pathlib import Path

    import gymnasium as gym

    from orchard_gym.envs.harbor.export import export_tasks

    try:
        kwargs = json.loads(env_kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError(f"--env-kwargs is a JSON object, not {env_kwargs!r}")
        env = gym.spec(env_id).make(**kwargs, backend={"type": "local"}).unwrapped
    except (gym.error.Error, ValueError, TypeError) as e:
        raise click.BadParameter(str(e), param_hint="--env / --env-kwargs") from None
    known = env.task_ids()
    unknown = [t for t in task_ids if t not in known]
    if unknown:
        shown = ", ".join(known[:10]) + (f", ... ({len(known)} in all)" if len(known) > 10 else "")
        raise click.BadParameter(f"{env_id} has no task {', '.join(map(repr, unknown))}; its tasks: {shown}",
                                 param_hint="--task-id")
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".orchard-export-probe").write_text("")
        (folder / ".orchard-export-probe").unlink()
    except OSError as e:
        raise click.BadParameter(f"cannot write task folders in {out}: {e.strerror or e}", param_hint="--out") \
            from None
    chosen = task_ids or known
    folders, refused = export_tasks({t: env.get_task(t) for t in chosen}, folder, env_id, base_image)
    for why in refused:
        click.echo(f"not exported: {why}", err=True)
    click.echo(f"{len(folders)} Harbor task folders in {out} ({fmt}); {len(refused)} refused")
    if refused:
        raise SystemExit(1)


@tasks_group.command("synth")
@click.option("--domain", required=True, help='what tasks to make, e.g. "everyday file and data tool use"')
@click.option("--n", "n", type=click.IntRange(min=1), required=True, help="tasks to keep")
@click.option("--pool", required=True, help="the assets and reference pool: a folder of skills, example tasks, "
                                            "documents, data")
@click.option("--out", type=click.Path(), required=True,
              help="dataset folder (Harbor task folders, the store synth.sqlite, synth-report.json); a folder "
                   "holding a store continues that run")
@click.option("--model", required=True, help="URL#MODEL of the proposer, pruner, builder and refiner")
@click.option("--tester", default=None, help="URL#MODEL of the model that attempts each task (default: --model)")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--proposals", type=click.IntRange(min=1), default=None, help="candidates to draft [default: 2 N]")
@click.option("--refine-budget", type=click.IntRange(min=0), default=2, show_default=True,
              help="refine rounds per task before it is dropped")
@click.option("--require-solved", is_flag=True, help="the tester must solve each task too (else it is refined)")
@click.option("--backend", type=click.Choice(["local", "docker"]), default="local", show_default=True,
              help="where builders work and tasks are tested (local: bubblewrap)")
@click.option("--price-cpu-hour", type=float, default=None, help="price of a sandbox CPU-hour, for the report")
@click.option("--price-1k-tokens", type=float, default=None, help="price of 1,000 model tokens, for the report")
def synth_cmd(domain, n, pool, out, model, tester, concurrency, proposals, refine_budget, require_solved, backend,
              price_cpu_hour, price_1k_tokens) -> None:
    """Make N tasks with their environments and verifiers: propose, prune, build, test, refine
    (docs/synthesis.md). Interrupted: run it again with the same --out.

    Example: orchard tasks synth --domain "csv and log tool use" --n 20 --pool assets/ --out synth/
    --model http://localhost:8000/v1#Qwen/Qwen3-32B
    """
    import asyncio
    from pathlib import Path

    from orchard_gym.envs.harbor.synth import SynthConfig, format_report, synthesize
    from orchard_gym.envs.harbor.synth.agents import MalformedOutput, ModelFailed
    from orchard_gym.ledger import prices

    try:
        price = prices(price_cpu_hour, price_1k_tokens)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--price-*") from None
    config = {"type": "local", "isolation": "bwrap"} if backend == "local" else {"type": "docker"}
    cfg = SynthConfig(domain=domain, n=n, pool=Path(pool), out=Path(out), model=model, tester=tester,
                      concurrency=concurrency, proposals=proposals, refine_budget=refine_budget,
                      require_solved=require_solved, backend=config,
                      price=price)
    try:
        report = asyncio.run(synthesize(cfg))
    except ModelFailed as e:
        raise click.ClickException(f"{e}\nNothing is lost: run the same command again to continue.") from None
    except MalformedOutput as e:
        raise click.ClickException(f"the model's answer is malformed: {e}") from None
    except KeyboardInterrupt:
        stop = click.ClickException("interrupted: the store keeps each task's stage; run the same command again "
                                    "to continue")
        stop.exit_code = 130
        raise stop from None
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    click.echo(format_report(report))
    if report["kept"] < n:
        raise SystemExit(1)
