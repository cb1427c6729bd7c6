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


if __name__ == "__main__":
    main()
