"""`orchard view RUN.jsonl`: a static HTML report of a run (see orchard_gym/viewer.py)."""

from __future__ import annotations

import click


@click.command("view")
@click.argument("run", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="report folder (default: RUN without .jsonl, plus -view)")
def view_cmd(run, out) -> None:
    """Write a static HTML report of RUN (trajectories JSONL from `orchard eval`); prints its path.

    Example: orchard view runs/eval.jsonl --out runs/eval-view && chromium runs/eval-view/index.html
    """
    from ..viewer import ViewerError, write_report

    try:
        click.echo(write_report(run, out))
    except ViewerError as e:
        raise click.ClickException(str(e)) from None
