"""The historical value model (Orchard §3.5): a causal-LM backbone whose LM head is replaced
by a scalar value head, trained offline on a trajectory pool.

- Each contiguous assistant response is one decision step; the value of turn t is read
  at the last token of the state just before its action (`EntryTokens.state_ends`).
  Observation and tool-result tokens carry no loss: only those positions are regressed.
- Targets: the terminal verifier reward (`success_reward`/`failure_reward`, default
  +1/-1) on the final turn, propagated backward by GAE (gamma=0.98, lambda=0.95):
  `delta_t = r_t + gamma V(s_{t+1}) - V(s_t)`, `A_t = delta_t + gamma lambda A_{t+1}`,
  target `A_t + V(s_t)`, with V(s_T) = 0 at the end. The bootstrap values V are 0 by
  default (then target_t = (gamma lambda)^(T-1-t) r); `bootstrap=True` recomputes the
  targets from the model's own values before every epoch after the first.
- MSE; train/validation split by task so validation tasks are unseen.

    from orchard_gym.algos.value import ValueTrainArgs, train_value, ValueModel
    model = train_value(read_pool("pool.jsonl"), "runs/tiny", "runs/value", ValueTrainArgs(epochs=4))
    values = ValueModel.load("runs/value").state_values(entry)   # V(s_0) .. V(s_T)
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .trajectory_pool import PoolEntry, split_by_task
from .pool_tokens import EntryTokenizer, EntryTokens


def gae_targets(rewards: Sequence[float], values: Sequence[float] | None = None, gamma: float = 0.98,
                lam: float = 0.95) -> list[float]:
    """Value targets (lambda-returns) of one trajectory's decision steps: `A_t + V(s_t)`.

    `rewards[t]` is the reward after action t (the terminal reward on the last one);
    `values[t]` = V(s_t) for t < T (zeros when None); V(s_T) = 0."""
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError("gamma and lambda must be in [0, 1]")
    T = len(rewards)
    v = list(values) if values is not None else [0.0] * T
    if len(v) != T:
        raise ValueError(f"{len(v)} values for {T} steps")
    targets, adv = [0.0] * T, 0.0
    for t in reversed(range(T)):
        nxt = v[t + 1] if t + 1 < T else 0.0
        delta = rewards[t] + gamma * nxt - v[t]
        adv = delta + gamma * lam * adv
        targets[t] = adv + v[t]
    return targets


def terminal_rewards(entry: PoolEntry, steps: int, success: float = 1.0, failure: float = -1.0) -> list[float]:
    return [0.0] * (steps - 1) + [success if entry.resolved else failure]


def mc_targets(entry: PoolEntry, gae: Sequence[float], success: float = 1.0, failure: float = -1.0) -> list[float]:
    """Targets where branching rollouts measured the state's value (`metadata["mc_values"]`, a
    share of successful continuations, mapped onto the reward scale); the GAE target elsewhere."""
    mc = entry.metadata.get("mc_values") or {}
    out = list(gae)
    for k, p in mc.items():
        if p is not None and 0 <= int(k) < len(out):
            out[int(k)] = failure + float(p) * (success - failure)
    return out


@dataclass
class ValueTrainArgs:
    gamma: float = 0.98
    lam: float = 0.95
    success_reward: float = 1.0
    failure_reward: float = -1.0
    epochs: int = 3
    learning_rate: float = 1e-5
    batch_size: int = 8
    val_fraction: float = 0.2
    max_length: int = field(default=4096, metadata={"help": "tokens per trajectory (longer ones: the tail is kept)"})
    bootstrap: bool = False
    mc_values: bool = field(default=False, metadata={"help": "Monte Carlo values of branching rollouts as targets "
                                                             "where the entry has them (envs/branching.py)"})
    render_tools: bool = False
    seed: int = 0


class ValueModel:
    """Backbone (`AutoModel`: the causal LM without its head) + `Linear(hidden, 1)`."""

    def __init__(self, backbone, tokenizer, config: dict | None = None):
        import torch

        self.backbone = backbone
        self.tokenizer = tokenizer
        self.config = dict(config or {})
        hidden = backbone.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        # small but not zero: a zero head passes no gradient to the backbone at the start
        torch.nn.init.normal_(self.head.weight, std=1.0 / hidden)
        torch.nn.init.zeros_(self.head.bias)
        self.tokens = EntryTokenizer(tokenizer, render_tools=self.config.get("render_tools", False))

    @classmethod
    def from_causal_lm(cls, path: str | Path, config: dict | None = None) -> ValueModel:
        """Any Hugging Face causal LM folder; its LM head is dropped."""
        from transformers import AutoModel, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
        backbone = AutoModel.from_pretrained(str(path))
        return cls(backbone, tokenizer, {**(config or {}), "base_model": str(path)})

    @classmethod
    def load(cls, path: str | Path) -> ValueModel:
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(path)
        if not (path / "value_head.pt").exists():
            raise FileNotFoundError(f"{path} is no value model (no value_head.pt): train one with orchard value train")
        config = json.loads((path / "value_config.json").read_text())
        model = cls(AutoModel.from_pretrained(str(path)), AutoTokenizer.from_pretrained(str(path)), config)
        model.head.load_state_dict(torch.load(path / "value_head.pt", weights_only=True))
        model.eval()
        return model

    def save(self, path: str | Path) -> None:
        import torch

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))
        torch.save(self.head.state_dict(), path / "value_head.pt")
        (path / "value_config.json").write_text(json.dumps(self.config, indent=2))

    def parameters(self):
        return list(self.backbone.parameters()) + list(self.head.parameters())

    def train(self):
        self.backbone.train()
        return self

    def eval(self):
        self.backbone.eval()
        return self

    def forward(self, ids_batch: list[list[int]]):
        """Values at every position: (B, L) tensor, right padding."""
        import torch

        width = max(len(x) for x in ids_batch)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        ids = torch.full((len(ids_batch), width), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, x in enumerate(ids_batch):
            ids[i, :len(x)] = torch.tensor(x)
            att[i, :len(x)] = 1
        device = next(self.backbone.parameters()).device
        hidden = self.backbone(input_ids=ids.to(device), attention_mask=att.to(device)).last_hidden_state
        return self.head(hidden.float()).squeeze(-1)

    def encode(self, entry: PoolEntry) -> tuple[list[int], list[int]]:
        """(ids, state ends) of an entry, cut to the model's max length (the tail is kept)."""
        tokens: EntryTokens = self.tokens(entry)
        ends = tokens.state_ends()
        limit = int(self.config.get("max_length", 4096))
        cut = max(0, len(tokens.ids) - limit)
        return tokens.ids[cut:], [max(e - cut, 0) for e in ends]

    def state_values(self, entry: PoolEntry) -> list[float]:
        """V(s_0) .. V(s_T) (T + 1 values for T actions), on the reward scale."""
        import torch

        ids, ends = self.encode(entry)
        with torch.no_grad():
            values = self.forward([ids])[0]
        return [float(values[e]) for e in ends]

    def probability(self, value: float) -> float:
        """A value as a success probability (the reward scale mapped onto [0, 1])."""
        lo, hi = self.config.get("failure_reward", -1.0), self.config.get("success_reward", 1.0)
        return min(1.0, max(0.0, (value - lo) / (hi - lo)))


def _batches(items: list, size: int, rng: random.Random):
    order = list(range(len(items)))
    rng.shuffle(order)
    for i in range(0, len(order), size):
        yield [items[j] for j in order[i:i + size]]


def _loss(model: ValueModel, batch: list[dict]):
    import torch

    values = model.forward([b["ids"] for b in batch])
    total, n = 0.0, 0
    for i, b in enumerate(batch):
        pred = values[i, b["ends"]]
        total = total + ((pred - torch.tensor(b["targets"], dtype=pred.dtype, device=pred.device)) ** 2).sum()
        n += len(b["ends"])
    return total / max(n, 1), n


def train_value(entries: Sequence[PoolEntry], base_model: str | Path, output_dir: str | Path,
                args: ValueTrainArgs | None = None, *, log=print) -> dict:
    """Train a value model on `entries` (split by task); saves it to `output_dir`. Returns a summary.
    Progress: a bar per epoch (stderr), then one `log` line (log=None: silent)."""
    import torch

    args = args or ValueTrainArgs()
    if not entries:
        raise ValueError("no trajectories to train the value model on")
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train_e, val_e = split_by_task(list(entries), args.val_fraction, args.seed)
    if not train_e:
        raise ValueError("every task went to validation: lower val_fraction or add tasks")
    model = ValueModel.from_causal_lm(base_model, {**asdict(args), "val_tasks": sorted({e.task_id for e in val_e})})

    def prepare(es):
        out = []
        for e in es:
            ids, ends = model.encode(e)
            steps = len(ends) - 1  # decision states s_0..s_{T-1}; s_T is no decision state
            if steps < 1:
                continue
            rewards = terminal_rewards(e, steps, args.success_reward, args.failure_reward)
            out.append({"entry": e, "ids": ids, "ends": ends[:-1], "rewards": rewards,
                        "targets": gae_targets(rewards, None, args.gamma, args.lam)})
            if args.mc_values:
                out[-1]["targets"] = mc_targets(e, out[-1]["targets"], args.success_reward, args.failure_reward)
        return out

    train_d, val_d = prepare(train_e), prepare(val_e)
    optim = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    history = []
    started = time.monotonic()
    from tqdm.auto import tqdm

    bar = tqdm(range(args.epochs), desc="value model", unit="epoch", disable=log is None)
    for epoch in bar:
        if args.bootstrap and epoch > 0:
            model.eval()
            for d in train_d:
                with torch.no_grad():
                    v = model.forward([d["ids"]])[0, d["ends"]].tolist()
                d["targets"] = gae_targets(d["rewards"], v, args.gamma, args.lam)
                if args.mc_values:
                    d["targets"] = mc_targets(d["entry"], d["targets"], args.success_reward, args.failure_reward)
        model.train()
        losses = []
        for batch in _batches(train_d, args.batch_size, rng):
            loss, _ = _loss(model, batch)
            optim.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            losses.append(float(loss.detach()))
        row = {"epoch": epoch + 1, "train_mse": sum(losses) / len(losses), "val_mse": evaluate_mse(model, val_d)}
        history.append(row)  # all of it in value_train.json; the bar shows the latest
        bar.set_postfix(train_mse=f"{row['train_mse']:.4f}",
                        val_mse="-" if row["val_mse"] is None else f"{row['val_mse']:.4f}")
    bar.close()
    if log is not None and history:
        log(f"[value] {len(history)} epochs: train mse {history[-1]['train_mse']:.4f}, val mse {history[-1]['val_mse']}")
    model.eval()
    model.save(output_dir)
    summary = {"train_trajectories": len(train_d), "val_trajectories": len(val_d),
               "train_tasks": len({d["entry"].task_id for d in train_d}),
               "val_tasks": len({d["entry"].task_id for d in val_d}), "history": history,
               "seconds": time.monotonic() - started, "output_dir": str(output_dir)}
    (Path(output_dir) / "value_train.json").write_text(json.dumps(summary, indent=2))
    return summary


def evaluate_mse(model: ValueModel, data: list[dict]) -> float | None:
    import torch

    if not data:
        return None
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for d in data:
            loss, k = _loss(model, [d])
            total += float(loss) * k
            n += k
    return total / n if n else math.nan
