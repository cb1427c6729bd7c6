"""`orchard export --format atif runs/x.jsonl`: trajectories in another format (orchard_gym/atif.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("export")
@click.argument("trajectories", type=click.Path(exists=True, dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["atif"]), default="atif", show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="default: TRAJECTORIES with .atif.jsonl")
@click.option("--agent", default="orchard-gym", show_default=True, help="ATIF agent.name")
def export_cmd(trajectories, fmt, out, agent) -> None:
    """Write each trajectory of a JSONL file (orchard eval's, harness runs too) as one ATIF-v1.8 object a line.

    Example: orchard export --format atif runs/eval.jsonl
    """
    from ..atif import to_atif
    from ..trajectory import Trajectory

    source = Path(trajectories)
    out_path = Path(out) if out else source.with_suffix(".atif.jsonl")
    count = 0
    with out_path.open("w") as sink:
        for number, line in enumerate(source.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                # a harness run's line: {"trajectory": ..., "record": {"calls": [...]}} (the recorded model calls)
                calls = (data.get("record") or {}).get("calls") if "trajectory" in data else None
                name = data.get("harness") or agent
                t = Trajectory.model_validate(data["trajectory"] if "trajectory" in data else data)
            except (ValueError, AttributeError) as e:
                raise click.ClickException(f"{source}:{number}: not a trajectory: {str(e)[:300]}") from None
            sink.write(json.dumps(to_atif(t, name, calls)) + "\n")
            count += 1
    click.echo(f"{count} trajectories -> {out_path} ({fmt})")
