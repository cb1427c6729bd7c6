"""`orchard pool`, `orchard value` and `orchard train sft` (see docs/value.md).

Heavy imports (torch, transformers, TRL) happen inside the commands."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

_TRAIN_HINT = "install the train extra: pip install 'orchard-gym[train]'"


def _json_opt(text: str, hint: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=hint) from None
    if not isinstance(value, dict):
        raise click.BadParameter("give a JSON object", param_hint=hint)
    return value


def _read(paths) -> list:
    from orchard_gym.algos.trajectory_pool import PoolError, read_pool

    try:
        entries = read_pool(*paths)
    except (PoolError, OSError) as e:
        raise click.ClickException(str(e)) from None
    if not entries:
        raise click.ClickException(f"no trajectories in {', '.join(map(str, paths))}")
    return entries


# ------------------------------------------------------------------------------ orchard pool
@click.group("pool")
def pool_group() -> None:
    """The trajectory pool: every episode, resolved or not, with its policy (a JSONL file)."""


@pool_group.command("add")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--pool", "pool_path", required=True, type=click.Path(dir_okay=False), help="pool file (appended to)")
@click.option("--policy-id", required=True, help="the checkpoint / harness+model that produced RUNS")
@click.option("--env", "env_id", default=None, help="env of the trajectories: rebuilds their prompts, tool names, "
              "gold-patch facts (needed for orchard eval files)")
@click.option("--env-kwargs", default="{}", show_default=True, help="env kwargs as JSON")
@click.option("--system-prompt", default=None, help="system prompt the episodes ran with (default: the runner's)")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="prune trajectories longer than this")
@click.option("--tokenizer", default=None, help="tokenizer folder to count tokens with (for --max-tokens)")
@click.option("--keep-undefined-tools", is_flag=True, help="keep trajectories calling tools the harness lacks")
@click.option("--keep-unparsable", is_flag=True, help="keep trajectories with unparsable actions")
@click.option("--cap-per-task", type=click.IntRange(min=1), default=None, help="at most this many per task")
@click.option("--balance", type=float, default=None, help="down-sample the majority class to RATIO x the minority")
@click.option("--seed", type=int, default=0, show_default=True)
def pool_add(runs, pool_path, policy_id, env_id, env_kwargs, system_prompt, max_tokens, tokenizer,
             keep_undefined_tools, keep_unparsable, cap_per_task, balance, seed) -> None:
    """Add RUNS (orchard eval trajectories, proxy exports or pool files) to a pool, filtered.

    Example: orchard pool add runs/eval.jsonl --pool pool.jsonl --policy-id sft-40 --env Orchard/Toy-v0
    """
    from orchard_gym.algos import trajectory_pool as P
    from orchard_gym.envs.rollout import SYSTEM_PROMPT

    info = None
    if env_id:
        try:
            info = P.TaskInfo(env_id, _json_opt(env_kwargs, "--env-kwargs"),
                              system_prompt if system_prompt is not None else SYSTEM_PROMPT)
        except P.PoolError as e:
            raise click.ClickException(str(e)) from None
    tok = None
    if max_tokens and tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    entries, skipped = [], 0
    try:
        for run in runs:
            got, bad = P.from_file(run, policy_id=policy_id, info=info)
            entries += got
            skipped += bad
        kept, dropped = P.filter_entries(entries, max_tokens=max_tokens, tokenizer=tok,
                                         drop_undefined_tools=not keep_undefined_tools,
                                         drop_unparsable=not keep_unparsable)
        if cap_per_task:
            kept = P.cap_per_task(kept, cap_per_task, seed)
        if balance:
            kept = P.balance_classes(kept, balance, seed)
    except (P.PoolError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    n = P.write_pool(pool_path, kept)
    s = P.summary(kept)
    click.echo(f"added {n} of {len(entries)} trajectories to {pool_path} ({s['resolved']} resolved, {s['tasks']} "
               f"tasks); skipped {skipped} with infrastructure errors; dropped {dict(dropped) or 'none'}"
               + (f"; capped/balanced to {n}" if cap_per_task or balance else ""))


@pool_group.command("show")
@click.argument("pools", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def pool_show(pools) -> None:
    """Counts of a pool: entries, resolved, tasks, entries per policy (JSON)."""
    from orchard_gym.algos.trajectory_pool import summary

    click.echo(json.dumps(summary(_read(pools)), indent=2))


# ------------------------------------------------------------------------------ orchard value
@click.group("value")
def value_group() -> None:
    """The historical value model: train it on a pool, rerank best-of-N candidates with it."""


@value_group.command("train")
@click.option("--pool", "pools", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "model_path", required=True, help="causal LM folder: the backbone (its LM head is dropped)")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="where the value model goes")
@click.option("--gamma", type=click.FloatRange(0, 1), default=0.98, show_default=True)
@click.option("--lam", type=click.FloatRange(0, 1), default=0.95, show_default=True, help="GAE lambda")
@click.option("--success-reward", type=float, default=1.0, show_default=True)
@click.option("--failure-reward", type=float, default=-1.0, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--lr", type=float, default=1e-5, show_default=True, help="learning rate (tiny models: ~5e-3)")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--val-fraction", type=click.FloatRange(0, 1, max_open=True), default=0.2, show_default=True,
              help="share of tasks held out (split by task)")
@click.option("--max-length", type=click.IntRange(min=8), default=4096, show_default=True)
@click.option("--bootstrap/--no-bootstrap", default=False, show_default=True,
              help="recompute GAE targets from the model's own values each epoch")
@click.option("--mc-values", is_flag=True, help="Monte Carlo values of branching rollouts as targets where present")
@click.option("--seed", type=int, default=0, show_default=True)
def value_train(pools, model_path, out, gamma, lam, success_reward, failure_reward, epochs, lr, batch_size,
                val_fraction, max_length, bootstrap, mc_values, seed) -> None:
    """Train a value model offline on pool trajectories.

    Example: orchard value train --pool pool.jsonl --model runs/tiny --out runs/value
    """
    try:
        from orchard_gym.algos.value import ValueTrainArgs, train_value
    except ImportError as e:
        raise click.ClickException(f"{e}; {_TRAIN_HINT}") from None
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    if success_reward <= failure_reward:
        raise click.BadParameter("must be above --failure-reward", param_hint="--success-reward")
    entries = _read(pools)
    args = ValueTrainArgs(gamma=gamma, lam=lam, success_reward=success_reward, failure_reward=failure_reward,
                          epochs=epochs, learning_rate=lr, batch_size=batch_size, val_fraction=val_fraction,
                          max_length=max_length, bootstrap=bootstrap, mc_values=mc_values, seed=seed)
    try:
        summary = train_value(entries, model_path, out, args, log=click.echo)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"value model: {out} ({summary['train_trajectories']} trajectories of {summary['train_tasks']} "
               f"tasks; {summary['val_trajectories']} of {summary['val_tasks']} held-out tasks for validation)")


@value_group.command("rerank")
@click.option("--value", "value_path", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--pool", "pools", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False),
              help="candidates (a pool of a new policy's N samples per task)")
@click.option("--policy-id", default=None, help="only candidates of this policy")
@click.option("--aggregation", type=click.Choice(["final", "end", "mean", "min", "max"]), default="final",
              show_default=True, help="how a candidate's step values become its score")
@click.option("--held-out/--all-tasks", default=True, show_default=True,
              help="only tasks the value model did not train on")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="write the picked entries (a pool file)")
@click.option("--seed", type=int, default=0, show_default=True)
def value_rerank(value_path, pools, policy_id, aggregation, held_out, out, seed) -> None:
    """Best-of-N: pick each task's highest-value candidate; the table vs random, first, oracle."""
    try:
        from orchard_gym.algos.rerank import format_table, group_by_task, pick, rerank
        from orchard_gym.algos.value import ValueModel
    except ImportError as e:
        raise click.ClickException(f"{e}; {_TRAIN_HINT}") from None
    try:
        model = ValueModel.load(value_path)
    except (FileNotFoundError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    entries = [e for e in _read(pools) if policy_id is None or e.policy_id == policy_id]
    if held_out:
        trained = None if "val_tasks" not in model.config else set(model.config["val_tasks"])
        entries = [e for e in entries if trained is None or e.task_id in trained]
    if not entries:
        raise click.ClickException("no candidates left (check --policy-id, or use --all-tasks)")
    table, scores = rerank(entries, model, aggregation, seed=seed)
    click.echo(format_table(table))
    click.echo(json.dumps(table))
    if out:
        from orchard_gym.algos.trajectory_pool import write_pool

        groups = group_by_task(entries)
        write_pool(out, [groups[t][pick(s)] for t, s in scores.items()], append=False)
        click.echo(f"picks: {out}")


# ------------------------------------------------------------------------------ orchard train sft
@click.command("sft")
@click.option("--pool", "pools", multiple=True, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "model_path", required=True, help="causal LM folder to fine-tune")
@click.option("--mode", type=click.Choice(["full", "rise", "per-turn", "calls"]), default="full", show_default=True)
@click.option("--out", default=None, type=click.Path(file_okay=False), help="run folder (default runs/sft-TIME)")
@click.option("--steps", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--lr", type=float, default=1e-5, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--resolved-only", is_flag=True, help="only resolved trajectories (the usual SFT pool)")
@click.option("--select", "selection", type=click.Choice(["random", "diverse-repo", "concentrated-repo",
              "multi-file", "large-diff", "composite"]), default=None, help="data selection strategy")
@click.option("-n", "n_select", type=click.IntRange(min=1), default=None, help="trajectories to select")
@click.option("--repo-cap", type=click.IntRange(min=1), default=None, help="diverse-repo: per-repo cap")
@click.option("--judge", default=None, help="rise: OpenAI-compatible judge URL#MODEL")
@click.option("--judge-local", default=None, type=click.Path(exists=True, file_okay=False),
              help="rise: a local causal LM folder as the judge")
@click.option("--judge-value", default=None, type=click.Path(exists=True, file_okay=False),
              help="rise: a value model (orchard value train) stands in for the judge")
@click.option("--judge-mc", is_flag=True, help="rise: Monte Carlo values of branching rollouts (orchard eval --branch-at)")
@click.option("--judge-prompt", default=None, type=click.Path(exists=True, dir_okay=False),
              help="judge prompt file (default: the packaged one)")
@click.option("--judge-api-key", envvar="ORCHARD_JUDGE_API_KEY", default=None)
@click.option("--judge-timeout", type=float, default=120.0, show_default=True)
@click.option("--eps", type=float, default=0.05, show_default=True, help="rise threshold on c_t")
@click.option("--seed", type=int, default=0, show_default=True)
def train_sft_cmd(pools, model_path, mode, out, steps, lr, batch_size, resolved_only, selection, n_select, repo_cap,
                  judge, judge_local, judge_value, judge_mc, judge_prompt, judge_api_key, judge_timeout, eps,
                  seed) -> None:
    """SFT (TRL SFTTrainer) on pool trajectories, loss only on the chosen action tokens.

    Example: orchard train sft --pool pool.jsonl --model runs/tiny --mode rise --judge-value runs/value
    """
    try:
        from transformers import AutoTokenizer

        from orchard_gym.algos import credit
        from orchard_gym.algos.pool_tokens import EntryTokenizer
        from orchard_gym.algos.sft import build_examples, select, train_sft
    except ImportError as e:
        raise click.ClickException(f"{e}; {_TRAIN_HINT}") from None
    entries = [e for e in _read(pools) if e.resolved or not resolved_only]
    if selection:
        entries = select(entries, n_select or len(entries), selection, seed=seed, repo_cap=repo_cap)
    curves = None
    if mode == "rise":
        judges = [j for j in (judge, judge_local, judge_value, judge_mc) if j]
        if len(judges) != 1 and any(not e.resolved for e in entries):
            raise click.UsageError("--mode rise needs exactly one of --judge, --judge-local, --judge-value, --judge-mc")
        try:
            if judge:
                j = credit.OpenAIJudge(judge, judge_prompt, api_key=judge_api_key, timeout=judge_timeout)
            elif judge_local:
                j = credit.LocalJudge(judge_local, judge_prompt)
            elif judge_value:
                from orchard_gym.algos.value import ValueModel

                j = credit.ValueJudge(ValueModel.load(judge_value))
            elif judge_mc:
                j = credit.MonteCarloJudge()
            else:
                j = None
        except (ValueError, FileNotFoundError) as e:
            raise click.ClickException(str(e)) from None
        annotated, dropped = credit.annotate(entries, j)
        click.echo(f"judge: {len(annotated)} of {len(entries)} trajectories kept; dropped {dict(dropped) or 'none'}")
        entries = [e for e, _ in annotated]
        curves = {e.entry_id: c for e, c in annotated}
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    try:
        examples = build_examples(entries, EntryTokenizer(tokenizer), mode, curves=curves, eps=eps)
        run_dir = out or f"runs/sft-{time.strftime('%Y%m%d-%H%M%S')}"
        summary = train_sft(examples, model_path, run_dir, steps=steps, learning_rate=lr, batch_size=batch_size,
                            seed=seed)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    click.echo(f"sft {mode}: {summary['examples']} examples, {summary['loss_tokens']} loss tokens, "
               f"{summary['steps']} steps, loss {summary['training_loss']:.4f}\nmodel: {summary['model']}")


# ------------------------------------------------------------------------------ orchard eval --best-of
def best_of(results: list, value_path: str, probe, n: int, aggregation: str = "final") -> list:
    """The reranked pick of every N consecutive episodes of a task (the eval's schedule order)."""
    from orchard_gym.algos.trajectory_pool import PoolError, TaskInfo, from_trajectory
    from orchard_gym.algos.rerank import pick, score
    from orchard_gym.algos.value import ValueModel

    model = ValueModel.load(value_path)
    info = TaskInfo(probe.env_id, env=probe, system_prompt=_system_prompt())  # the eval's own probe env
    picks = []
    for i in range(0, len(results), n):
        group = results[i:i + n]
        scores = []
        for t in group:
            if not t.ok:  # an infrastructure error is never picked
                scores.append(float("-inf"))
                continue
            try:
                scores.append(score(model.state_values(from_trajectory(t, policy_id="eval", info=info)),
                                    aggregation))
            except PoolError as e:
                raise click.ClickException(str(e)) from None
        chosen = group[pick(scores)]
        chosen.metadata["best_of"] = {"n": len(group), "scores": scores,
                                      "resolved": [bool(t.ok and t.reward > 0) for t in group]}
        picks.append(chosen)
    return picks


def _system_prompt() -> str:
    from orchard_gym.envs.rollout import SYSTEM_PROMPT

    return SYSTEM_PROMPT
