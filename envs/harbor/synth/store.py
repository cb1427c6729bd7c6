"""The synthesis store: one SQLite file that holds every candidate task and the stage it is at.

The proposers append to it (an instruction already there, up to case, punctuation and spacing,
is refused and counted as a duplicate), the later stages move each task along the stage
machine (docs/synthesis.md), and every agent run is a row of `runs` with its ledger. A run
that stops, however it stops, continues from what the store says.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY,
    instruction TEXT NOT NULL,
    norm TEXT NOT NULL UNIQUE,          -- the instruction normalized: the dedupe key
    rationale TEXT,
    stage TEXT NOT NULL,                -- see STAGES
    reason TEXT,                        -- why it was discarded or dropped
    slug TEXT,                          -- its folder name in the output
    folder BLOB,                        -- the task folder as a gzip tar (the latest build or patch)
    refines INTEGER NOT NULL DEFAULT 0, -- refine rounds spent
    checks TEXT,                        -- JSON: the last test's outcome (oracle, nothing, tester)
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS duplicates (
    id INTEGER PRIMARY KEY,
    instruction TEXT NOT NULL,
    duplicate_of INTEGER NOT NULL REFERENCES tasks(id),
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    task INTEGER REFERENCES tasks(id),  -- NULL for propose and prune calls
    stage TEXT NOT NULL,                -- propose | prune | build | test | refine
    role TEXT NOT NULL,                 -- proposer | pruner | builder | oracle | nothing | tester | refiner
    model TEXT,
    ok INTEGER NOT NULL,
    error TEXT,
    reward REAL,
    ledger TEXT NOT NULL,               -- orchard_gym.ledger.Ledger as JSON
    at REAL NOT NULL
);
"""

# proposed -> selected | discarded (prune); selected -> built (build); built -> accepted | failing (test);
# failing -> built (refine patched it) | dropped (budget spent, or the refiner gave up)
STAGES = ("proposed", "selected", "discarded", "built", "failing", "accepted", "dropped")
FINAL = ("discarded", "accepted", "dropped")


def normalize(instruction: str) -> str:
    """The dedupe key: lower case, words only, single spaces."""
    return " ".join(re.findall(r"[a-z0-9]+", instruction.lower()))


class Store:
    """The store at `path` (made on first use). One connection, used from one event loop."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None)  # autocommit: each write lands at once
            self.db.row_factory = sqlite3.Row
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as e:
            raise ValueError(f"{self.path} is not a synthesis store: {e}") from None

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row["value"]) if row else None

    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value)))

    # ------------------------------------------------------------------ tasks
    def propose(self, instruction: str, rationale: str | None = None) -> tuple[int, bool]:
        """(task id, True) for a new instruction; (id of the one it repeats, False) for a duplicate."""
        norm = normalize(instruction)
        if not norm:
            raise ValueError("an empty instruction")
        now = time.time()
        found = self.db.execute("SELECT id FROM tasks WHERE norm = ?", (norm,)).fetchone()
        if found:
            self.db.execute("INSERT INTO duplicates (instruction, duplicate_of, at) VALUES (?, ?, ?)",
                            (instruction, found["id"], now))
            return found["id"], False
        cur = self.db.execute("INSERT INTO tasks (instruction, norm, rationale, stage, created_at, updated_at) "
                              "VALUES (?, ?, ?, 'proposed', ?, ?)", (instruction.strip(), norm, rationale, now, now))
        return int(cur.lastrowid or 0), True

    def move(self, task_id: int, stage: str, **fields: Any) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        if "checks" in fields and not isinstance(fields["checks"], (str, type(None))):
            fields["checks"] = json.dumps(fields["checks"])
        sets = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE tasks SET stage = ?, updated_at = ?{', ' + sets if sets else ''} WHERE id = ?",
                        (stage, time.time(), *fields.values(), task_id))

    def task(self, task_id: int) -> sqlite3.Row:
        return self.db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()

    def tasks(self, *stages: str) -> list[sqlite3.Row]:
        if not stages:
            return self.db.execute("SELECT * FROM tasks ORDER BY id").fetchall()
        marks = ",".join("?" * len(stages))
        return self.db.execute(f"SELECT * FROM tasks WHERE stage IN ({marks}) ORDER BY id", stages).fetchall()

    def counts(self) -> dict[str, int]:
        found = Counter({row["stage"]: row["n"] for row in
                         self.db.execute("SELECT stage, COUNT(*) AS n FROM tasks GROUP BY stage")})
        return {stage: found.get(stage, 0) for stage in STAGES}

    def duplicates(self) -> list[sqlite3.Row]:
        return self.db.execute("SELECT * FROM duplicates ORDER BY id").fetchall()

    # ------------------------------------------------------------------ runs (the costs)
    def record_run(self, stage: str, role: str, ledger: Any, *, task: int | None = None, model: str | None = None,
                   ok: bool = True, error: str | None = None, reward: float | None = None) -> None:
        self.db.execute("INSERT INTO runs (task, stage, role, model, ok, error, reward, ledger, at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (task, stage, role, model, int(ok), error, reward, ledger.model_dump_json(), time.time()))

    def runs(self, stage: str | None = None, role: str | None = None, task: int | None = None) -> list[sqlite3.Row]:
        query, args = "SELECT * FROM runs WHERE 1", []
        for column, value in (("stage", stage), ("role", role), ("task", task)):
            if value is not None:
                query += f" AND {column} = ?"
                args.append(value)
        return self.db.execute(query + " ORDER BY id", args).fetchall()
