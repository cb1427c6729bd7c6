"""The `orchard` command line."""

from __future__ import annotations

import json
import sys
import time

import click

from .. import __version__


class _Group(click.Group):
    """Shows our own errors as one clear line instead of a traceback."""

    def invoke(self, ctx):
        from ..import_interrupt import disarm
        from ..errors import OrchardError

        disarm()  # from here on Ctrl-C is a KeyboardInterrupt: what the command started is cleaned up
        try:
            return super().invoke(ctx)
        except OrchardError as e:
            raise click.ClickException(f"{type(e).__name__}: {e}") from e
        except click.UsageError as e:  # one line, not the usage block
            one = click.ClickException(f"{e.format_message()} (see {e.ctx.command_path if e.ctx else 'orchard'} -h)")
            one.exit_code = e.exit_code
            raise one from None
        except (KeyboardInterrupt, click.Abort):  # Ctrl-C: the finally blocks above have cleaned up
            from ..import_interrupt import exit_interrupted

            exit_interrupted("interrupted (what it had started was stopped)")
            stop = click.ClickException("interrupted (what it had started was stopped)")
            stop.exit_code = 130
            raise stop from None
        except ModuleNotFoundError as e:  # an optional dependency: say which extra brings it
            extra = next((x for x, mods in _EXTRAS.items() if (e.name or "").split(".")[0] in mods), None)
            if extra is None:
                raise
            raise click.ClickException(f"{e}: this needs the {extra} extra "
                                       f"(pip install 'orchard-gym[{extra}]', or bash scripts/install.sh {extra})") from e


_EXTRAS = {"server": {"fastapi", "uvicorn", "starlette", "redis", "prometheus_client", "httptools", "uvloop"},
           "train": {"torch", "transformers", "trl", "accelerate", "matplotlib", "tokenizers", "yaml"},
           "swe": {"datasets", "pyarrow"}, "docker": {"docker"}, "k8s": {"kubernetes"}, "gui": {"miniwob", "PIL"}}


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orchard")
def main() -> None:
    """orchard-gym: sandboxes and Gymnasium envs for LLM agents."""
    import warnings

    from ..warnings_once import install as warnings_once

    warnings.filterwarnings("once", category=FutureWarning)  # a dependency's deprecation: once, not per step
    warnings_once()  # ... even where a dependency's catch_warnings blocks reset "once"


def _client(backend: str, base_url: str | None, api_key: str | None):
    from ..client import SandboxClient

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
@click.option("--root", default=None, help="local sandbox root (default: $ORCHARD_LOCAL_ROOT or /tmp/orchard-gym-UID; "
                                           "`orchard serve`'s: /tmp/orchard-gym-serve-UID)")
@click.option("--backend", default="local", show_default=True, type=click.Choice(["local", "docker"]))
def sandbox_gc(root, backend) -> None:
    """Remove sandboxes left behind by processes that died (local folders; docker containers and volumes),
    and the warm-pool sandboxes, claimed or idle, of an `orchard serve` that is gone."""
    import asyncio

    from ..backends.config import parse_backend_config

    config = {"type": "docker"} if backend == "docker" else {"type": "local", "root": root}
    the_backend = parse_backend_config(config).get_backend()
    swept = list(the_backend.swept)  # both sweep when they start
    if backend == "local":
        swept += asyncio.run(_gc_pools(the_backend))
    click.echo(f"removed {len(swept)} sandbox(es): {' '.join(swept) or '-'}")


async def _gc_pools(backend) -> list[str]:
    """Pooled sandboxes whose orchestrator is gone and that no record claims (with
    $ORCHARD_REDIS_URL set, the replicas' shared records are asked)."""
    import os

    from ..service.pools import sweep_left_behind
    from ..service.store import MemoryStore

    if os.environ.get("ORCHARD_REDIS_URL"):
        from ..service.app import make_store
        from ..service.settings import ServiceSettings

        store = make_store(ServiceSettings())
    else:
        store = MemoryStore()
    await store.start()
    try:
        return await sweep_left_behind(backend, store, None)
    finally:
        await store.aclose()
        await backend.aclose()


@main.command("agent", add_help_option=False,
              context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def agent_cmd(ctx) -> None:
    """Start an execution agent by hand (arguments as `python3 orchard_gym/agent --help`)."""
    import runpy

    from ..agent import AGENT_DIR

    sys.argv = ["orchard-agent", *ctx.args]
    runpy.run_path(AGENT_DIR, run_name="__main__")  # the folder on sys.path[0], as in a sandbox


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


def _price_opts(f):
    """--price-cpu-hour / --price-1k-tokens (orchard_gym/ledger.py)."""
    f = click.option("--price-1k-tokens", type=float, default=None, help="price of 1,000 model tokens (ledger)")(f)
    return click.option("--price-cpu-hour", type=float, default=None, help="price of a sandbox CPU-hour (ledger)")(f)


def _prices(cpu_hour, per_1k_tokens):
    from ..ledger import prices

    try:
        return prices(cpu_hour, per_1k_tokens)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _backend_kwargs(backend: str, api_key: str | None) -> dict:
    """--backend local|docker|kubernetes|URL -> env/client kwargs."""
    if backend.startswith(("http://", "https://")):
        return {"base_url": backend, "api_key": api_key}
    return {"backend": {"type": backend}}


@main.command("eval")
@click.option("--env", "env_id", default="Orchard/SWE-v0", show_default=True, help="registered env id")
@click.option("--tasks", default="builtin", show_default=True,
              help="'builtin', a JSON/JSONL/Parquet file, a folder or a Hugging Face dataset name")
@click.option("--split", default=None, help="split of a dataset folder or hub dataset (SWE)")
@click.option("--image-prefix", default=None, help="registry/namespace replacing that of the task images (SWE)")
@click.option("--policy", default="oracle", show_default=True, help="oracle | nothing (the do-nothing baseline) | "
              "openai:URL#MODEL")
@click.option("--max-error-rate", type=click.FloatRange(0.0, 1.0), default=None,
              help="exit 1 when more than this share of episodes failed (policy or infrastructure errors) "
                   "[default: only when all did]")
@click.option("--backend", default="local", show_default=True, help="local | docker | kubernetes | orchestrator URL")
@click.option("--api-key", envvar="ORCHARD_API_KEY", help="orchestrator API key")
@click.option("--model-api-key", envvar="OPENAI_API_KEY", help="API key of the model endpoint")
@click.option("-n", "episodes", type=click.IntRange(min=1), default=None, help="episodes (default: each task once)")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--task-id", "task_filter", multiple=True, help="only these task ids (repeatable)")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="trajectories JSONL (default runs/eval-TIME.jsonl)")
@click.option("-k", "attempts", type=click.IntRange(min=1), default=1, show_default=True,
              help="attempts per task: reports pass@k and pass^k")
@click.option("--harness", default=None, help="run every task through these harnesses (a,b,c): one table; "
              "policy oracle | nothing | openai:URL#MODEL (see docs/harnesses.md)")
@click.option("--policies", default=None, help="--harness: the cross-harness matrix, one row per named policy "
              "(NAME=SPEC,NAME=SPEC; SPEC as --policy)")
@click.option("--train-harness", default=None, help="--policies: the harness each named model was trained on "
              "(NAME=HARNESS,...), the matrix's 'trained on' column")
@click.option("--best-of", "best_of_n", type=click.IntRange(min=1), default=1, show_default=True,
              help="sample N episodes per attempt and keep the one --value ranks highest")
@click.option("--value", "value_model", type=click.Path(exists=True, file_okay=False), default=None,
              help="value model (orchard value train) for --best-of")
@click.option("--env-kwargs", default="{}", show_default=True, help="extra env kwargs as JSON")
@click.option("--branch-at", multiple=True, type=click.IntRange(min=0), help="fork --branches continuations at "
              "this turn (repeatable): Monte Carlo values per turn (docs/branching.md)")
@click.option("--branches", type=click.IntRange(min=1), default=4, show_default=True)
@_price_opts
def eval_cmd(env_id, tasks, split, image_prefix, policy, max_error_rate, backend, api_key, model_api_key, episodes, concurrency,
             max_steps, task_filter, out, attempts, harness, policies, train_harness, best_of_n, value_model, env_kwargs,
             branch_at, branches, price_cpu_hour, price_1k_tokens) -> None:
    """Run episodes of an env with a policy; write trajectories and print a summary.

    Example: orchard eval --policy oracle -n 10 --concurrency 4
    """
    price = _prices(price_cpu_hour, price_1k_tokens)
    if harness is None and (policies or train_harness):
        raise click.UsageError("--policies and --train-harness need --harness (the cross-harness matrix)")
    if harness is not None:
        from .harness import eval_harnesses

        return eval_harnesses(harness=harness, env_id=env_id, tasks=tasks, policy=policy, episodes=episodes,
                              policies=policies, train_harness=train_harness,
                              backend_kwargs=_backend_kwargs(backend, api_key), model_api_key=model_api_key,
                              attempts=attempts, concurrency=concurrency, max_steps=max_steps,
                              task_filter=task_filter, out=out, price=price, max_error_rate=max_error_rate)
    import asyncio
    from pathlib import Path

    from ..client import AsyncSandboxClient
    from ..envs.rollout import run_episodes
    from ..errors import EndpointSpecError
    from ..policies import NothingPolicy, OpenAIPolicy, OraclePolicy

    if policy == "oracle":
        agent = OraclePolicy()
    elif policy == "nothing":
        agent = NothingPolicy()
    elif policy.startswith("openai:"):
        try:
            agent = OpenAIPolicy(policy, api_key=model_api_key)
        except EndpointSpecError as e:
            raise click.BadParameter(str(e), param_hint="--policy") from None
    else:
        raise click.BadParameter("use oracle, nothing or openai:URL#MODEL", param_hint="--policy")
    spec = _env_spec(env_id)
    extra = {k: v for k, v in (("split", split), ("image_prefix", image_prefix)) if v is not None}
    try:
        user_kw = dict(json.loads(env_kwargs))
        env_kw = {**user_kw, **extra, **({} if tasks == "builtin" else {"tasks": tasks})}
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise click.BadParameter(f"not a JSON object: {e}", param_hint="--env-kwargs") from None
    from ..registration import env_tasks

    try:
        tasks_by_id = env_tasks(env_id, **env_kw)  # from the task source: no env, sandbox or backend
        probe = spec.make(**{**env_kw, "tasks": tasks_by_id}).unwrapped  # asked about tools and oracle, never reset
    except (ValueError, FileNotFoundError, ImportError) as e:  # a bad task file names its line and field
        raise click.BadParameter(str(e), param_hint="--tasks") from None
    except TypeError as e:  # an argument the env does not take
        raise click.ClickException(f"--env-kwargs: {e}") from None
    ids = [t for t in sorted(tasks_by_id) if not task_filter or t in task_filter]
    if task_filter and len(ids) != len(set(task_filter)):
        raise click.BadParameter(f"unknown task ids: {sorted(set(task_filter) - set(ids))}", param_hint="--task-id")
    if policy == "oracle" and hasattr(probe, "oracle_policy"):
        agent = probe.oracle_policy()  # an env whose tasks carry their own solutions (Claw)
    episodes = episodes or len(ids)
    if best_of_n > 1 and not value_model:
        raise click.UsageError("--best-of needs --value MODEL")
    if branch_at:
        from ..envs.branching import BranchError, check_branching

        try:
            check_branching(list(branch_at), branches, max_steps)
        except BranchError as e:
            raise click.BadParameter(str(e), param_hint="--branch-at") from None
    schedule = [ids[i % len(ids)] for i in range(episodes) for _ in range(attempts * best_of_n)]
    out_path = Path(out or f"runs/eval-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    from ..screenshots import ScreenshotFiles  # image observations: PNG files next to the JSONL, for `orchard view`

    screenshots = ScreenshotFiles(out_path.with_name(out_path.stem + "-screenshots"), out_path.parent)

    async def run():
        client = AsyncSandboxClient(**probe.client_kwargs(_backend_kwargs(backend, api_key)))
        with out_path.open("w") as sink:
            def write(trajectory):
                sink.write(trajectory.model_dump_json() + "\n")
                sink.flush()

            def make_env(c):
                return spec.make(**{**user_kw, "tasks": tasks_by_id}, client=c, max_steps=max_steps).unwrapped

            try:
                return await run_episodes(make_env, agent, schedule, concurrency=concurrency, client=client,
                                          on_done=write, screenshots=screenshots,
                                          branch_at=list(branch_at) or None, branches=branches)
            finally:
                await client.aclose()
                if hasattr(agent, "aclose"):
                    await agent.aclose()

    results = asyncio.run(run())
    wall = time.monotonic() - started
    ran = results  # what the ledger sums: with --best-of, every candidate's sandboxes and tokens
    if best_of_n > 1:  # keep the reranked episode of every N (see docs/value.md)
        from .value import best_of

        candidates, results = results, best_of(results, value_model, probe, best_of_n)
        picks_path = out_path.with_suffix(".best-of.jsonl")
        picks_path.write_text("".join(t.model_dump_json() + "\n" for t in results))
        click.echo(f"best-of-{best_of_n}: {len(results)} picks of {len(candidates)} candidates "
                   f"({sum(1 for t in candidates if t.ok and t.reward > 0)} resolved); picks: {picks_path}")
    ok = [t for t in results if t.ok]
    resolved = sum(1 for t in ok if t.reward > 0)
    broken = sum(1 for t in results if t.error_kind == "grading")  # the task, not the agent, failed
    tampered = sum(1 for t in ok if (t.report or {}).get("tampering"))  # reward 0.0: reached for the test runner
    click.echo(f"\n{env_id} · policy {policy} · backend {backend} · {len(results)} episodes in {wall:.1f}s")
    click.echo(f"resolved {resolved}/{len(results)} ({resolved / len(results):.1%}); "
               f"infrastructure errors {len(results) - len(ok) - broken}; broken tasks {broken}; tampering {tampered}")
    if results:
        steps = sum(t.steps for t in results) / len(results)
        secs = sum(max(0.0, (t.ended_at or t.started_at) - t.started_at) for t in results) / len(results)
        click.echo(f"mean steps {steps:.1f}; mean episode time {secs:.1f}s")
        _echo_pass_at_k(results, attempts)
        from ..ledger import format_summary, summarize

        click.echo(format_summary(summarize(ran, price)))
    for t in results:
        mark = ("BROKEN TASK " if t.error_kind == "grading" else "ERROR ") + t.error if t.error else \
            "resolved" if t.reward > 0 else "TAMPERING" if (t.report or {}).get("tampering") else "unresolved"
        click.echo(f"  {t.task_id:28} reward {t.reward:.1f}  steps {t.steps:2}  {mark}")
    click.echo(f"trajectories: {out_path}")
    from .exit import exit_if_failed

    exit_if_failed(len(results) - len(ok) - broken, len(results), max_error_rate,
                    next((t.error for t in results if t.error and t.error_kind != "grading"), None))


def _env_spec(env_id: str):
    """The registered spec of ENV_ID, or a one-line --env error."""
    import gymnasium as gym

    import orchard_gym  # noqa: F401 - registers the ids

    try:
        return gym.spec(env_id)
    except gym.error.Error as e:
        raise click.ClickException(f"--env: {e}") from None


def _echo_pass_at_k(results, k: int) -> None:
    """pass@k (some attempt of a task passed) and pass^k (all k did), the mean task score and,
    where the env reports them (Claw), its parts."""
    by_task: dict[str, list[bool]] = {}
    for t in results:
        by_task.setdefault(t.task_id, []).append(bool(t.report.get("passed", t.reward > 0)) if t.ok else False)
    n = len(by_task)
    at_k = sum(any(v) for v in by_task.values()) / n
    hat_k = sum(all(v) for v in by_task.values()) / n
    click.echo(f"pass@{k} {at_k:.1%}; pass^{k} {hat_k:.1%} over {n} tasks; "
               f"mean task score {sum(t.reward for t in results) / len(results):.3f}")
    parts = [p for p in ("completion", "safety", "robustness") if any(p in t.report for t in results)]
    if parts:
        click.echo("; ".join(f"mean {p} {sum(t.report.get(p, 0.0) for t in results) / len(results):.3f}"
                             for p in parts))


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--backend", type=click.Choice(["local", "docker", "kubernetes"]), default=None,
              help="backend type [default: $ORCHARD_BACKEND or local]")
@click.option("--redis-url", default=None, help="share state with other replicas [default: $ORCHARD_REDIS_URL]")
@click.option("--pool", "pools", multiple=True, metavar="IMAGE=N[,cpu=..,memory=..]",
              help="keep N ready sandboxes of IMAGE (repeatable; docs/pools.md) [default: $ORCHARD_POOLS]")
def serve_cmd(host, port, backend, redis_url, pools) -> None:
    """Run the orchestrator: the REST API over a backend (settings: ORCHARD_* env vars,
    see docs/orchestrator.md). Needs the server extra (pip install 'orchard-gym[server]')."""
    from ..service.settings import ServiceSettings

    overrides = {k: v for k, v in {"backend": backend, "redis_url": redis_url, "pools": list(pools) or None}.items()
                 if v is not None}
    try:
        from ..service.app import serve
    except ImportError as e:
        raise click.ClickException(f"{e}: install the server extra (pip install 'orchard-gym[server]')") from e
    from pydantic import ValidationError

    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as e:  # one line per bad setting, never the values (they may be secrets)
        problems = "; ".join(f"ORCHARD_{'_'.join(map(str, err['loc'])).upper() or 'SETTINGS'}: {err['msg']}"
                             for err in e.errors())
        raise click.ClickException(f"bad orchestrator settings: {problems}") from None
    serve(settings, host=host, port=port)


@main.command("serve-env")
@click.argument("env_id")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=8010, show_default=True, type=click.IntRange(0, 65535))
@click.option("--backend", default="local", show_default=True, help="local | docker | kubernetes | orchestrator URL")
@click.option("--api-key", envvar="ORCHARD_API_KEY", help="orchestrator API key")
@click.option("--max-sessions", type=click.IntRange(min=1), default=8, show_default=True,
              help="concurrent sessions (one sandbox each)")
@click.option("--session-timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="seconds before an idle session is reaped (its sandbox deleted)")
def serve_env_cmd(env_id, host, port, backend, api_key, max_sessions, session_timeout) -> None:
    """Serve ENV_ID (e.g. Orchard/Claw-v0) through OpenEnv's server (docs/integrations.md).
    Needs the integrations extra (pip install 'orchard-gym[integrations]')."""
    try:
        from ..integrations.openenv import serve
    except ImportError as e:
        raise click.ClickException(f"{e}: install the integrations extra (pip install 'orchard-gym[integrations]')") \
            from e
    serve(env_id, host=host, port=port, max_sessions=max_sessions, session_timeout=session_timeout,
          **_backend_kwargs(backend, api_key))


@main.command("proxy")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind")
@click.option("--port", default=8100, show_default=True, type=click.IntRange(0, 65535))
@click.option("--upstream", default=None, help="OpenAI-compatible base URL to forward to (upstream mode), "
              "e.g. http://localhost:8000/v1; without it rollouts are in policy mode")
@click.option("--upstream-api-key", envvar="ORCHARD_UPSTREAM_API_KEY", default=None, help="API key for the upstream")
@click.option("--upstream-model", default=None, help="model name sent upstream instead of the harness's")
@click.option("--uds", default=None, help="also listen on this unix socket (model endpoints only; for sandboxes)")
@click.option("--admin-key", envvar="ORCHARD_PROXY_ADMIN_KEY", default=None,
              help="key of the control API [default: $ORCHARD_PROXY_ADMIN_KEY, else generated and printed]")
@click.option("--public-url", default=None, help="base of the URLs handed out (default http://HOST:PORT)")
def proxy_cmd(host, port, upstream, upstream_api_key, upstream_model, uds, admin_key, public_url) -> None:
    """Run the recording proxy: OpenAI-compatible endpoints per rollout that record every
    model call (see docs/recording.md). Prints its URL and admin key as one JSON line.

    Example: orchard proxy --port 8100 --upstream http://localhost:8000/v1
    """
    try:
        from ..wrappers.proxy.server import ProxyConfig, serve
    except ImportError as e:
        raise click.ClickException(f"{e}: install the server extra (pip install 'orchard-gym[server]')") from e
    serve(ProxyConfig(host=host, port=port, upstream=upstream, upstream_api_key=upstream_api_key,
                      upstream_model=upstream_model, uds=uds, admin_key=admin_key, public_url=public_url))


@main.group(cls=_Group)
def train() -> None:
    """Train policies on sandboxed episodes (needs the train extra: pip install 'orchard-gym[train]')."""


@train.command("grpo")
@click.option("--env", "env_id", default="Orchard/Toy-v0", show_default=True, help="registered env id")
@click.option("--env-kwargs", default="{}", show_default=True, help="extra env kwargs as JSON")
@click.option("--model", "model_path", required=True, help="policy model folder (transformers format)")
@click.option("--algo", type=click.Choice(["grpo", "bar"]), default="grpo", show_default=True,
              help="fixed groups or Balanced Adaptive Rollout")
@click.option("--steps", type=click.IntRange(min=1), default=100, show_default=True, help="optimiser steps")
@click.option("--group-size", type=click.IntRange(min=2), default=8, show_default=True, help="episodes per group")
@click.option("--prompts-per-step", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--micro-batch", type=click.IntRange(min=1), default=None, help="episodes per forward/backward")
@click.option("--lr", type=float, default=1e-6, show_default=True, help="learning rate")
@click.option("--step-budget", default="15,30@50%", show_default=True,
              help="step-budget curriculum, e.g. '15,30@50%', '15,30@200' or '15,30' (equal phases)")
@click.option("--max-seconds", type=float, default=600.0, show_default=True, help="per-episode wall-clock budget")
@click.option("--concurrency", type=click.IntRange(min=1), default=32, show_default=True, help="sandboxes at once")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=512, show_default=True, help="per turn")
@click.option("--max-completion-tokens", type=click.IntRange(min=1), default=8192, show_default=True,
              help="per episode (actions and observations)")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--dynamic-sampling/--no-dynamic-sampling", default=True, show_default=True,
              help="replace groups whose rewards are all equal")
@click.option("--max-resamples", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--bar-stride", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--bar-max-rollouts", type=click.IntRange(min=2), default=32, show_default=True)
@click.option("--bar-low", type=float, default=0.25, show_default=True, help="lowest positive fraction")
@click.option("--bar-high", type=float, default=0.75, show_default=True, help="highest positive fraction")
@click.option("--bar-on-exhausted", type=click.Choice(["drop", "keep"]), default="drop", show_default=True)
@click.option("--task-id", "task_filter", multiple=True, help="train on these task ids only (repeatable)")
@click.option("--system-prompt", default=None, help="system prompt (default: the rollout runner's)")
@click.option("--render-tools/--no-render-tools", default=True, show_default=True,
              help="put the tool schemas into the prompt")
@click.option("--backend", default="local", show_default=True, help="local | docker | kubernetes | orchestrator URL")
@click.option("--api-key", envvar="ORCHARD_API_KEY", help="orchestrator API key")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None, help="run folder (default runs/grpo-TIME)")
@click.option("--plot/--no-plot", default=True, show_default=True, help="draw curves.png at the end")
@click.option("--harness", default=None, help="train on this harness's recorded calls (docs/harnesses.md)")
@click.option("--gamma", type=click.FloatRange(0.0, 1.0), default=1.0, show_default=True,
              help="--harness: r_t = gamma^(T-t) * r_T")
@click.option("--max-calls", type=click.IntRange(min=1), default=8, show_default=True,
              help="--harness: model calls answered per run")
@click.option("--opd-teacher", default=None, help="on-policy distillation teacher: model folder or URL[#MODEL]")
@click.option("--opd-coef", type=float, default=1.0, show_default=True, help="weight of the OPD per-token term")
@click.option("--opd-only", is_flag=True, help="OPD alone: no outcome reward, grading skipped")
@click.option("--rpr-judge", default=None, help="process-reward judge: URL#MODEL or a local model folder")
@click.option("--rpr-rubric", default=None, help="rubric YAML or swe|claw|gui|generic (default: by env)")
@click.option("--rpr-combine", default="sum:0.5", show_default=True, help="sum:LAMBDA | gated:THRESHOLD | process")
@click.option("--branch-at", type=click.IntRange(min=0), default=None,
              help="fork each group from one root at turn K: per-turn advantages (docs/branching.md)")
@click.option("--use-vllm", type=click.Choice(["server", "colocate"]), default=None,
              help="generate every turn with TRL's vLLM (needs vllm and a GPU; docs/training.md)")
@click.option("--vllm-server-url", default=None, help="--use-vllm server: the trl vllm-serve URL")
@_price_opts
def train_grpo(env_id, env_kwargs, model_path, algo, steps, group_size, prompts_per_step, micro_batch, lr,
               step_budget, max_seconds, concurrency, max_new_tokens, max_completion_tokens, temperature,
               dynamic_sampling, max_resamples, bar_stride, bar_max_rollouts, bar_low, bar_high, bar_on_exhausted,
               task_filter, system_prompt, render_tools, backend, api_key, seed, out, plot, harness, gamma,
               max_calls, opd_teacher, opd_coef, opd_only, rpr_judge, rpr_rubric, rpr_combine, branch_at,
               use_vllm, vllm_server_url, price_cpu_hour, price_1k_tokens) -> None:
    """Multi-turn agent GRPO (TRL) on sandboxed episodes, with BAR or fixed groups.

    Example: orchard train grpo --env Orchard/Toy-v0 --model runs/tiny --algo bar --steps 50
    """
    try:
        kwargs = json.loads(env_kwargs)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--env-kwargs") from None
    price = _prices(price_cpu_hour, price_1k_tokens)
    from pathlib import Path

    try:  # the env and its kwargs, before a model is loaded
        _env_spec(env_id).make(**kwargs, backend={"type": "local"}).close()
    except (TypeError, ValueError) as e:
        raise click.ClickException(f"--env-kwargs: {e}") from None
    try:
        import trl  # noqa: F401 - the train extra, checked before anything starts
        from orchard_gym.algos.agent_rollout import SamplingParams
        from orchard_gym.algos.bar import BARConfig
        from orchard_gym.algos.grpo import AgentGRPOArgs, train as run_training
        from orchard_gym.algos.dense import opd_args, rpr_args
        from orchard_gym.envs.rollout import SYSTEM_PROMPT
    except ImportError as e:  # pragma: no cover - the train extra is missing
        raise click.ClickException(f"{e}; install the train extra: pip install 'orchard-gym[train]'") from e
    backend_kwargs = _backend_kwargs(backend, api_key)
    harness_kwargs = {}
    _check_harness_flags(harness, system_prompt)
    if harness is not None:  # each rollout a harness run, each recorded call a sample (algos/harness_grpo.py)
        from orchard_gym.algos.harness_grpo import HarnessGRPOArgs as AgentGRPOArgs, train as run_training

        harness_kwargs = {"harness": harness, "gamma": gamma, "max_calls": max_calls}
    try:
        args = AgentGRPOArgs(**harness_kwargs,
            env_id=env_id, env_kwargs=kwargs, backend=backend_kwargs.get("backend"),
            base_url=backend_kwargs.get("base_url"), api_key=backend_kwargs.get("api_key"),
            task_ids=list(task_filter) or None, algo=algo, group_size=group_size, prompts_per_step=prompts_per_step,
            micro_batch_size=micro_batch, dynamic_sampling=dynamic_sampling, max_resamples=max_resamples,
            bar=BARConfig(group_size=group_size, stride=bar_stride, max_rollouts=max(bar_max_rollouts, group_size),
                          low=bar_low, high=bar_high, on_exhausted=bar_on_exhausted),
            step_budget=step_budget, max_seconds=max_seconds, concurrency=concurrency,
            sampling=SamplingParams(max_new_tokens=max_new_tokens, max_completion_tokens=max_completion_tokens,
                                    temperature=temperature),
            system_prompt=system_prompt if system_prompt is not None else SYSTEM_PROMPT,
            render_tools=render_tools, seed=seed,
            opd=opd_args(opd_teacher, opd_coef, opd_only), rpr=rpr_args(rpr_judge, rpr_rubric, rpr_combine),
            prices=price, use_vllm=use_vllm, vllm_server_url=vllm_server_url,
            **({"branch_at": branch_at} if branch_at is not None else {}))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if not (Path(model_path) / "config.json").is_file():  # after the flags: their mistakes are said first
        raise click.ClickException(f"--model {model_path}: not a model folder (no config.json)")
    run_dir = out or f"runs/grpo-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = run_training(args, model_path, run_dir, steps=steps, learning_rate=lr)
    last = summary.get("last") or {}
    click.echo(f"\n{env_id} · {algo} · {summary['steps']} steps in {summary['train_runtime'] or 0:.1f}s")
    for key in ("rollout/success_rate", "rollout/informative_share", "rollout/rollouts_per_prompt",
                "tokens_per_second", "rollout/episode_turns", "opd/kl", "opd/dropped_share", "rpr/process_mean",
                "rpr/dropped_share", "ledger/cpu_seconds", "ledger/tokens", "ledger/cost",
                "ledger/informative_groups_per_cost"):
        first = (summary.get("first") or {}).get(key)
        if first is not None or last.get(key) is not None:
            click.echo(f"  {key:30} first {first if first is None else round(first, 3)!s:>8}  "
                       f"last {last.get(key) if last.get(key) is None else round(last[key], 3)!s:>8}")
    click.echo(f"metrics: {summary['metrics']}\nmodel: {run_dir}/final")
    if plot:
        from orchard_gym.algos.plot import plot_run

        click.echo(f"curves: {plot_run(run_dir)}")


def _check_harness_flags(harness: str | None, system_prompt: str | None) -> None:
    """Flags that only mean something with (or without) --harness are refused, never ignored; the
    rest is checked by HarnessGRPOArgs (docs/training.md says which flags combine)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    if harness is None:
        given = [f"--{name.replace('_', '-')}" for name in ("gamma", "max_calls")
                 if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)]
        if given:
            raise click.UsageError(f"{' / '.join(given)} only apply with --harness")
    elif system_prompt is not None:
        raise click.UsageError("--system-prompt does not combine with --harness: the harness sends its own")


@main.command("plot")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="PNG path (default RUN_DIR/curves.png)")
def plot_cmd(run_dir, out) -> None:
    """Draw a training run's curves (RUN_DIR/metrics.jsonl) to a PNG."""
    from orchard_gym.algos.plot import plot_run

    try:
        click.echo(plot_run(run_dir, out))
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from None


from .export import export_cmd  # noqa: E402 - commands of their own modules
from .tasks import tasks_group  # noqa: E402
from .value import pool_group, train_sft_cmd, value_group  # noqa: E402
from .view import view_cmd  # noqa: E402

main.add_command(tasks_group)
main.add_command(export_cmd)
main.add_command(view_cmd)
main.add_command(pool_group)
main.add_command(value_group)
train.add_command(train_sft_cmd)
