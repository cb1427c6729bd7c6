"""How `orchard eval` ends when the run itself failed (shared by commands.py and harness.py)."""

from __future__ import annotations

import sys

import click


def exit_if_failed(failed: int, total: int, max_rate: float | None, first: str | None) -> None:
    """A run the policy or the infrastructure failed exits 1, saying so last (stderr)."""
    if total and (failed > max_rate * total if max_rate is not None else failed == total):
        share = f"all {total}" if failed == total else f"{failed}/{total}"
        limit = f", more than --max-error-rate {max_rate}" if max_rate is not None else ""
        click.echo(f"orchard: {share} episodes failed (the policy or the infrastructure){limit}; first error: "
                   f"{(first or '?').splitlines()[0][:200]}", err=True)
        sys.exit(1)
