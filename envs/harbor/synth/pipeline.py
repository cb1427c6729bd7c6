"""The stage machine: propose, prune, then build -> test -> refine per task, driven by the store.

Each step reads a task's stage from the store and writes the next one before going on, so a
run stopped anywhere (killed, a model that went away) continues from where it was: a task
caught mid-build is built again, one caught mid-test tested again. Accepted folders are written
to the output before their stage says so.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from orchard_gym.ledger import Ledger

from . import agents, folders, prompts
from .pool import load_pool
from .report import make_report, write_report
from .store import Store, normalize
from .testing import rollout_text, test_task
from .workshop import Job

STORE_NAME = "synth.sqlite"
RUNS_NAME = "synth-runs.jsonl"  # every builder, test and refiner episode (orchard view / orchard export read it)
NEAR_DUPLICATE = 0.9  # difflib ratio of two normalized instructions above which the later one is pruned


@dataclass
class SynthConfig:
    domain: str
    n: int
    pool: Path
    out: Path
    model: str
    tester: str | None = None
    concurrency: int = 4
    proposals: int | None = None  # candidates to draft before pruning (default 2 N)
    per_proposer: int = 5
    refine_budget: int = 2
    require_solved: bool = False  # the tester must solve the task too (else it is refined like a failed check)
    build_steps: int = 30
    test_steps: int = 30
    backend: Any = field(default_factory=lambda: {"type": "local", "isolation": "bwrap"})
    progress: bool = True
    price: Any = None  # orchard_gym.ledger.Prices for the report's costs
    on_stage: Callable[[int, str], None] | None = None  # (task id, new stage): tests watch the machine with it

    def validate(self) -> None:
        if not self.domain.strip():
            raise ValueError("--domain is empty: say what tasks to make, e.g. 'everyday file and data tool use'")
        if self.n < 1 or self.concurrency < 1 or self.refine_budget < 0 or self.per_proposer < 1:
            raise ValueError("--n, --concurrency and the per-proposer count must be >= 1, the refine budget >= 0")
        agents.check_model(self.model, "--model")
        if self.tester:
            agents.check_model(self.tester, "--tester")
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {str(self.out)!r} is a file, not a folder")


class Pipeline:
    def __init__(self, cfg: SynthConfig):
        cfg.validate()
        self.cfg = cfg
        self.pool = load_pool(cfg.pool)
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.store = Store(cfg.out / STORE_NAME)
        self._claim_store()
        self.pool_blob = folders.pack(self.pool.root)
        self.bar: Any = None

    def _claim_store(self) -> None:
        """A store continues only the run it was made for (same domain); a fresh one records it."""
        domain = self.store.get_meta("domain")
        if domain is None:
            self.store.set_meta("domain", self.cfg.domain)
            self.store.set_meta("n", self.cfg.n)
        elif domain != self.cfg.domain:
            raise ValueError(f"{self.store.path} continues a run for the domain {domain!r}, not {self.cfg.domain!r}: "
                             f"give another --out")

    # ------------------------------------------------------------------ driver
    async def run(self) -> dict:
        self.bar = tqdm(total=self.cfg.n, desc="synth", unit="task", disable=not self.cfg.progress)
        try:
            self._show()
            if not self.store.get_meta("pruned"):
                await self.propose()
                await self.prune()
            gate = asyncio.Semaphore(self.cfg.concurrency)
            todo = self.store.tasks("selected", "built", "failing")
            await asyncio.gather(*(self._one(row["id"], gate) for row in todo))
        finally:
            self.bar.close()
        report = make_report(self.store, self.cfg, self.cfg.price)
        write_report(report, self.cfg.out)
        return report

    def _move(self, task_id: int, stage: str, **fields: Any) -> None:
        self.store.move(task_id, stage, **fields)
        if self.cfg.on_stage:
            self.cfg.on_stage(task_id, stage)
        self._show()

    def _keep(self, trajectory: Any, stage: str, role: str, task_id: int) -> None:
        trajectory.metadata["synth"] = {"stage": stage, "role": role, "task": task_id}
        with (self.cfg.out / RUNS_NAME).open("a") as sink:
            sink.write(trajectory.model_dump_json() + "\n")

    def _show(self) -> None:
        counts = self.store.counts()
        self.bar.n = counts["accepted"]
        self.bar.set_postfix_str(" ".join(f"{k} {v}" for k, v in counts.items() if v), refresh=True)

    # ------------------------------------------------------------------ propose
    async def propose(self) -> None:
        target = self.cfg.proposals or 2 * self.cfg.n
        digest = self.pool.digest()
        angle, failures = 0, []
        for _round in range(3 * math.ceil(target / self.cfg.per_proposer) + 1):
            have = len(self.store.tasks())
            if have >= target:
                break
            calls = min(self.cfg.concurrency, math.ceil((target - have) / self.cfg.per_proposer))
            known = [row["instruction"] for row in self.store.tasks()]
            results = await asyncio.gather(*(
                agents.propose(self.cfg.model, self.cfg.domain, digest, known, self.cfg.per_proposer, angle + i)
                for i in range(calls)), return_exceptions=True)
            angle += calls
            added = 0
            for result in results:
                if isinstance(result, agents.ModelFailed):
                    raise result
                if isinstance(result, BaseException):
                    if not isinstance(result, agents.MalformedOutput):
                        raise result
                    failures.append(str(result))
                    self.store.record_run("propose", "proposer", Ledger(), model=self.cfg.model,
                                          ok=False, error=str(result))
                    continue
                items, ledger = result
                self.store.record_run("propose", "proposer", ledger, model=self.cfg.model)
                for text, why in items:
                    added += self.store.propose(text, why)[1]
            self._show()
            if not added:
                break  # the proposers repeat themselves (or answer nothing usable): prune what there is
        if not self.store.tasks():
            raise agents.MalformedOutput("no proposer gave a usable instruction: " + "; ".join(failures[:3]))

    # ------------------------------------------------------------------ prune
    async def prune(self) -> None:
        candidates: list[tuple[int, str]] = []
        for row in self.store.tasks("proposed"):
            twin = next((i for i, text in candidates
                         if difflib.SequenceMatcher(None, normalize(text), row["norm"]).ratio() >= NEAR_DUPLICATE), None)
            if twin is not None:
                self._move(row["id"], "discarded", reason=f"near-duplicate of #{twin}")
            else:
                candidates.append((row["id"], row["instruction"]))
        if len(candidates) > self.cfg.n:
            selection, ledger = await agents.select(self.cfg.model, self.cfg.domain, candidates, self.cfg.n)
            self.store.record_run("prune", "pruner", ledger, model=self.cfg.model)
            keep, reasons = set(selection.keep), selection.reasons
        else:
            keep, reasons = {i for i, _ in candidates}, {}
        for task_id, _ in candidates:
            if task_id in keep:
                self._move(task_id, "selected")
            else:
                self._move(task_id, "discarded", reason="pruner: " + reasons.get(
                    task_id, f"not among the {self.cfg.n} selected"))
        self.store.set_meta("pruned", True)

    # ------------------------------------------------------------------ build, test, refine
    async def _one(self, task_id: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            while True:
                row = self.store.task(task_id)
                stage = row["stage"]
                if stage == "selected":
                    await self.build(row)
                elif stage == "built":
                    await self.test(row)
                elif stage == "failing":
                    await self.refine(row)
                else:
                    return

    async def build(self, row: Any) -> None:
        job = Job(prompt=prompts.builder_prompt(self.cfg.domain, row["instruction"]), pool=self.pool_blob)
        run = await agents.workshop(self.cfg.model, job, self.cfg.backend, self.cfg.build_steps,
                                    prompts.BUILDER_SYSTEM)
        ok = run.folder is not None and not run.problems
        self._keep(run.trajectory, "build", "builder", row["id"])
        self.store.record_run("build", "builder", run.trajectory.ledger, task=row["id"], model=self.cfg.model,
                              ok=ok, error=run.trajectory.error or "; ".join(run.problems) or None)
        if run.folder is None:
            self._move(row["id"], "dropped", reason=f"build: no task folder came back ({run.trajectory.error})")
            return
        slug = folders.slug(row["instruction"], row["id"])
        if run.problems:  # caught before testing: the refiner repairs it like any failed check
            self._move(row["id"], "failing", slug=slug, folder=run.folder,
                       checks={"failures": [f"orchard tasks check: {p}" for p in run.problems], "rollout": None})
        else:
            self._move(row["id"], "built", slug=slug, folder=run.folder)

    async def test(self, row: Any) -> None:
        tester = self.cfg.tester or self.cfg.model
        outcome = await test_task(row["folder"], row["slug"], self.cfg.backend, tester, self.cfg.test_steps,
                                  self.cfg.require_solved)
        for role, trajectory in outcome.trajectories.items():
            self._keep(trajectory, "test", role, row["id"])
            self.store.record_run("test", role, trajectory.ledger or Ledger(), task=row["id"],
                                  model=tester if role == "tester" else None, ok=not trajectory.error,
                                  error=trajectory.error, reward=trajectory.reward)
        checks = {**outcome.checks, "failures": outcome.failures,
                  "rollout": rollout_text(outcome.trajectories.get("tester"))}
        if outcome.passed:
            dest = self.cfg.out / row["slug"]
            folders.unpack(row["folder"], dest)  # the folder lands first: an accepted stage always has it
            self._move(row["id"], "accepted", checks=checks)
        else:
            self._move(row["id"], "failing", checks=checks)

    async def refine(self, row: Any) -> None:
        checks = json.loads(row["checks"] or "{}")
        failures = checks.get("failures") or ["(no failure recorded)"]
        if row["refines"] >= self.cfg.refine_budget:
            self._move(row["id"], "dropped", reason=f"failed its checks after {row['refines']} refine round(s): "
                                                    + "; ".join(failures)[:1000])
            return
        job = Job(prompt=prompts.refiner_prompt(self.cfg.domain, row["instruction"], failures,
                                                checks.get("rollout") or "(none: the build did not load)"),
                  pool=self.pool_blob, folder=row["folder"])
        run = await agents.workshop(self.cfg.model, job, self.cfg.backend, self.cfg.build_steps,
                                    prompts.REFINER_SYSTEM)
        verdict = (run.verdict or "").strip()
        self._keep(run.trajectory, "refine", "refiner", row["id"])
        self.store.record_run("refine", "refiner", run.trajectory.ledger, task=row["id"], model=self.cfg.model,
                              ok=run.folder is not None, error=run.trajectory.error or verdict or None)
        if verdict.lower().startswith("give-up"):
            self._move(row["id"], "dropped", reason=f"refiner gave up: {verdict[len('give-up'):].lstrip(': ')}")
        elif run.folder is None:
            self._move(row["id"], "dropped", reason=f"refine: no task folder came back ({run.trajectory.error})")
        elif run.problems:
            self._move(row["id"], "failing", folder=run.folder, refines=row["refines"] + 1,
                       checks={"failures": [f"orchard tasks check: {p}" for p in run.problems],
                               "rollout": checks.get("rollout"), "verdict": verdict})
        else:
            self._move(row["id"], "built", folder=run.folder, refines=row["refines"] + 1)


async def synthesize(cfg: SynthConfig) -> dict:
    """Run (or continue) a synthesis into `cfg.out`; the report (also `OUT/synth-report.json`)."""
    pipeline = Pipeline(cfg)
    try:
        return await pipeline.run()
    finally:
        pipeline.store.close()

