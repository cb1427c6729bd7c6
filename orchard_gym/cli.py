"""The `orchard` command line."""

from __future__ import annotations

import json
import sys
import time

import click

from . import __version__


class _Group(click.Group):
    """Shows our own errors as one clear line instead of a traceback."""

    def invoke(self, ctx):
        from .errors import OrchardError

        try:
            return super().invoke(ctx)
        except OrchardError as e:
            raise click.ClickException(f"{type(e).__name__}: {e}") from e


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orchard")
def main() -> None:
    """orchard-gym: sandboxes and Gymnasium envs for LLM agents."""


def _client(backend: str, base_url: str | None, api_key: str | None):
    from .client import SandboxClient

    if base_url:
        return SandboxClient(base_url=base_url, api_key=api_key)
    return SandboxClient({"type": backend})


_backend_opt = click.option("--backend", default="local", show_default=True, help="backend type")
_url_opt = click.option("--base-url", envvar="ORCHARD_BASE_URL", help="orchestrator URL (instead of a backend)")
_key_opt = click.option("--api-key", envvar="ORCHARD_API_KEY", help="orchestrator API key")


@main.group(cls=_Group)
def sandbox() -> None:
    """Create, use and clean up sandboxes."""


@sandbox.command("run", context_settings={"ignore_unknown_options": True})
@_backend_opt
@_url_opt
@_key_opt
@click.option("--image", default=None, help="task image (local backend: host)")
@click.option("--network/--no-network", default=False, show_default=True, help="allow network access")
@click.option("--timeout", default=600.0, show_default=True, help="seconds before the command is killed")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def sandbox_run(backend, base_url, api_key, image, network, timeout, command) -> None:
    """Run COMMAND in a fresh sandbox, print its output, exit with its exit code.

    Example: orchard sandbox run -- python3 -c 'print(6*7)'
    """
    with _client(backend, base_url, api_key) as client:
        with client.create_sandbox(image=image, block_network=not network) as box:
            argv = list(command)
            result = box.exec(argv[0] if len(argv) == 1 else argv, timeout=timeout)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        click.echo(f"orchard: timed out after {timeout}s", err=True)
    sys.exit(result.exit_code if result.exit_code is not None and result.exit_code >= 0 else 124)


@sandbox.command("ls")
@_backend_opt
@_url_opt
@_key_opt
def sandbox_ls(backend, base_url, api_key) -> None:
    """List sandboxes (JSON lines)."""
    with _client(backend, base_url, api_key) as client:
        for record in client.list_sandboxes():
            click.echo(json.dumps(record.public()))


@sandbox.command("gc")
@click.option("--root", default=None, help="local sandbox root (default: $ORCHARD_LOCAL_ROOT or /tmp/orchard-gym-UID)")
def sandbox_gc(root) -> None:
    """Remove local sandboxes left behind by processes that died."""
    from .backends.config import LocalBackendConfig
    from .backends.local import LocalBackend

    backend = LocalBackend(LocalBackendConfig(root=root))
    click.echo(f"removed {len(backend.swept)} sandbox(es): {' '.join(backend.swept) or '-'}")


@main.command("agent", add_help_option=False,
              context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def agent_cmd(ctx) -> None:
    """Start an execution agent by hand (arguments as `python agent.py --help`)."""
    from . import agent

    sys.exit(agent.main(ctx.args))


@main.command()
@_backend_opt
def demo(backend) -> None:
    """Create a local sandbox, run a few commands in it and print what happened."""
    steps = [
        ("who and where", "echo \"$(id -un) in $(pwd)\"; uname -sr"),
        ("python inside", "python3 -c 'import sys; print(sys.version.split()[0])'"),
        ("files", "echo 'print(6 * 7)' > answer.py && python3 answer.py"),
        ("network interfaces (only loopback: no network)", "tail -n +3 /proc/net/dev | cut -d: -f1"),
        ("a runaway command is killed", "sleep 30"),
    ]
    with _client(backend, None, None) as client:
        started = time.monotonic()
        box = client.create_sandbox()
        click.echo(f"sandbox {box.sandbox_id} ready in {time.monotonic() - started:.2f}s "
                   f"(isolation: {box.record.details.get('isolation', backend)})")
        for title, command in steps:
            result = box.exec(command, timeout=2 if "sleep" in command else 60)
            out = (result.stdout + result.stderr).strip() or "(no output)"
            click.echo(f"\n$ {command}   # {title}\n{out}\n-> exit {result.exit_code}, "
                       f"{result.duration:.3f}s{', timed out' if result.timed_out else ''}")
        box.delete()
        click.echo(f"\ndeleted {box.sandbox_id}")


def _backend_kwargs(backend: str, api_key: str | None) -> dict:
    """--backend local|docker|kubernetes|URL -> env/client kwargs."""
    if backend.startswith(("http://", "https://")):
        return {"base_url": backend, "api_key": api_key}
    return {"backend": {"type": backend}}


@main.command("eval")
@click.option("--env", "env_id", default="Orchard/SWE-v0", show_default=True, help="registered env id")
@click.option("--tasks", default="builtin", show_default=True, help="'builtin', a JSON/JSONL file or a folder")
@click.option("--policy", default="oracle", show_default=True, help="oracle | openai:URL#MODEL")
@click.option("--backend", default="local", show_default=True, help="local | docker | kubernetes | orchestrator URL")
@click.option("--api-key", envvar="ORCHARD_API_KEY", help="orchestrator API key")
@click.option("--model-api-key", envvar="OPENAI_API_KEY", help="API key of the model endpoint")
@click.option("-n", "episodes", type=click.IntRange(min=1), default=None, help="episodes (default: each task once)")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--task-id", "task_filter", multiple=True, help="only these task ids (repeatable)")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="trajectories JSONL (default runs/eval-TIME.jsonl)")
def eval_cmd(env_id, tasks, policy, backend, api_key, model_api_key, episodes, concurrency, max_steps, task_filter,
             out) -> None:
    """Run episodes of an env with a policy; write trajectories and print a summary.

    Example: orchard eval --policy oracle -n 10 --concurrency 4
    """
    import asyncio
    from pathlib import Path

    import gymnasium as gym

    from .client import AsyncSandboxClient
    from .envs.rollout import run_episodes
    from .policies import OpenAIPolicy, OraclePolicy

    if policy == "oracle":
        agent = OraclePolicy()
    elif policy.startswith("openai:"):
        agent = OpenAIPolicy(policy[len("openai:"):], api_key=model_api_key)
    else:
        raise click.BadParameter("use oracle or openai:URL#MODEL", param_hint="--policy")
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        raise click.BadParameter(str(e), param_hint="--env") from None
    probe = spec.make(tasks=tasks, backend={"type": "local"}).unwrapped
    ids = [t for t in probe.task_ids() if not task_filter or t in task_filter]
    if task_filter and len(ids) != len(set(task_filter)):
        raise click.BadParameter(f"unknown task ids: {sorted(set(task_filter) - set(ids))}", param_hint="--task-id")
    episodes = episodes or len(ids)
    schedule = [ids[i % len(ids)] for i in range(episodes)]
    out_path = Path(out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    async def run():
        client = AsyncSandboxClient(**_backend_kwargs(backend, api_key))
        with out_path.open("w") as sink:
            def write(trajectory):
                sink.write(trajectory.model_dump_json() + "\n")
                sink.flush()

            def make_env(c):
                return spec.make(tasks=probe._tasks, client=c, max_steps=max_steps).unwrapped

            try:
                return await run_episodes(make_env, agent, schedule, concurrency=concurrency, client=client,
                                          on_done=write)
            finally:
                await client.aclose()
                if hasattr(agent, "aclose"):
                    await agent.aclose()

    results = asyncio.run(run())
    wall = time.monotonic() - started
    ok = [t for t in results if t.ok]
    resolved = sum(1 for t in ok if t.reward > 0)
    click.echo(f"\n{env_id} · policy {policy} · backend {backend} · {len(results)} episodes in {wall:.1f}s")
    click.echo(f"resolved {resolved}/{len(results)} ({resolved / len(results):.1%}); "
               f"infrastructure errors {len(results) - len(ok)}")
    if results:
        steps = sum(t.steps for t in results) / len(results)
        secs = sum((t.ended_at or t.started_at) - t.started_at for t in results) / len(results)
        click.echo(f"mean steps {steps:.1f}; mean episode time {secs:.1f}s")
    for t in results:
        mark = "ERROR " + t.error if t.error else ("resolved" if t.reward > 0 else "unresolved")
        click.echo(f"  {t.task_id:28} reward {t.reward:.1f}  steps {t.steps:2}  {mark}")
    click.echo(f"trajectories: {out_path}")


if __name__ == "__main__":
    main()
