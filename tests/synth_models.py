"""A scripted OpenAI-compatible model for the synthesis tests: it plays every role of
`orchard tasks synth` (proposer, pruner, builder, refiner, tester) through the same
`/v1/chat/completions` door a real model would, recognizing the role from the system prompt
("You are the ROLE of ...") and the task from the instruction it is shown.

The domain is small, everyday tool use over files: sum a CSV column, count error lines in a
log, list names from a JSON file. `SynthModel(defective={"errors"})` builds the log task with a
verifier that rewards doing nothing (the refiner repairs it); `hold="errors"` makes the
builder's first request for that task wait until `release()` (to interrupt a run there).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchard_gym.wrappers.proxy.openai_format import chat_completion
from orchard_gym.wrappers.proxy import ProxyConfig, RecordingProxy

BASE = "localhost/orchard/bookworm:latest"
PASS = 'mkdir -p /logs/verifier\nif {cond}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n'

RECIPES = {
    "expenses": {
        "instruction": "Sum the amount column of /app/expenses.csv and write the total to /app/total.txt.",
        "data": {"expenses.csv": "date,item,amount\n2026-01-02,coffee,12\n2026-01-03,train,30\n2026-01-04,lunch,8\n"},
        "solve": "awk -F, 'NR>1{s+=$3} END{print s}' /app/expenses.csv > /app/total.txt",
        "check": '[ "$(tr -d " \\n" < /app/total.txt 2>/dev/null)" = 50 ]',
    },
    "errors": {
        "instruction": "Count the lines containing ERROR in /app/app.log and write the count to /app/errors.txt.",
        "data": {"app.log": "INFO start\nERROR disk full\nINFO retry\nERROR disk full\nWARN slow\nERROR timeout\n"},
        "solve": "grep -c ERROR /app/app.log > /app/errors.txt",
        "check": '[ "$(tr -d " \\n" < /app/errors.txt 2>/dev/null)" = 3 ]',
    },
    "names": {
        "instruction": "Write the names in /app/contacts.json, sorted alphabetically, one per line, to /app/names.txt.",
        "data": {"contacts.json": '[{"name": "Mara"}, {"name": "Ade"}, {"name": "Lin"}]\n'},
        "solve": "python3 -c 'import json; print(\"\\n\".join(sorted(c[\"name\"] for c in json.load(open(\"/app/contacts.json\")))))' > /app/names.txt",
        "check": '[ "$(cat /app/names.txt 2>/dev/null)" = "$(printf "Ade\\nLin\\nMara")" ]',
    },
}

# what the proposers answer: a repeat (case and punctuation aside), a near-duplicate, and three distinct tasks
PROPOSALS = [
    RECIPES["expenses"]["instruction"],
    "sum the AMOUNT column of /app/expenses.csv,  and write the total to /app/total.txt",
    RECIPES["errors"]["instruction"],
    "Count the lines containing ERROR in /app/app.log and write the count into /app/errors.txt.",
    RECIPES["names"]["instruction"],
]


KEYS = {"expenses.csv": "expenses", "app.log": "errors", "contacts.json": "names"}


def recipe_of(text: str) -> str | None:
    """The task a conversation is about (on the local backend the tester reads `expenses.csv`, not `/app/...`)."""
    return next((name for key, name in KEYS.items() if key in text), None)


def heredoc(path: str, content: str) -> str:
    return f"mkdir -p \"$(dirname {path})\" && cat > {path} <<'SYNTH_EOF'\n{content}\nSYNTH_EOF\n"


def task_files(name: str, defective: bool) -> dict[str, str]:
    r = RECIPES[name]
    check = "true" if defective else r["check"]  # the defect: a verifier that passes whatever the end state
    copies = "".join(f"COPY {f} /app/{f}\n" for f in r["data"])
    files = {
        "task/instruction.md": r["instruction"],
        "task/task.toml": f'schema_version = "1.4"\n[task]\nname = "synth/{name}"\n[agent]\ntimeout_sec = 120.0\n'
                          '[verifier]\ntimeout_sec = 60.0\n[environment]\nnetwork_mode = "no-network"',
        "task/environment/Dockerfile": f"FROM {BASE}\nWORKDIR /app\n{copies}",
        "task/tests/test.sh": "#!/bin/bash\n" + PASS.format(cond=check),
        "task/solution/solve.sh": f"#!/bin/bash\nset -e\n{r['solve']}",
    }
    files.update({f"task/environment/{f}": content.rstrip("\n") for f, content in r["data"].items()})
    return files


def write_command(files: dict[str, str]) -> str:
    return "".join(heredoc(p, c) for p, c in files.items()) + "find task -type f | sort"


class SynthModel:
    """The scripted model on 127.0.0.1 (a thread of its own). `.calls` counts requests per
    (role, recipe); the roles in `.malformed` answer prose instead of their tool call."""

    def __init__(self, *, defective: set[str] | frozenset[str] = frozenset(), hold: str | None = None,
                 solve_as_tester: bool = True):
        self.defective, self.hold, self.solve_as_tester = set(defective), hold, solve_as_tester
        self.malformed: set[str] = set()
        self.calls: Counter = Counter()
        self.held = threading.Event()      # a held request is waiting
        self._release = threading.Event()
        self._runner = RecordingProxy(ProxyConfig(host="127.0.0.1", port=0))
        self._runner.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._runner.port}/v1"

    def spec(self, name: str = "scripted") -> str:
        return f"{self.url}#{name}"

    def release(self) -> None:
        self._release.set()

    def __enter__(self) -> SynthModel:
        self._runner.start_in_thread()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self._runner.stop_in_thread()

    # ------------------------------------------------------------------ the roles
    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        messages = body["messages"]
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        found = re.match(r"You are the (\w+) of", system)
        role = found.group(1) if found else "tester"
        text = json.dumps(messages)
        name = recipe_of(json.dumps(messages[1]["content"]) if role != "proposer" else "")
        self.calls[(role, name)] += 1
        turn = sum(m["role"] == "assistant" for m in messages)
        if role == "builder" and name == self.hold and not self._release.is_set():
            self.held.set()
            await asyncio.to_thread(self._release.wait, 300)
        message = ({"role": "assistant", "content": "Here are some great ideas!"} if role in self.malformed
                   else getattr(self, f"_{role}")(name, turn, messages))
        usage = {"prompt_tokens": len(text.split()), "completion_tokens": 20, "total_tokens": len(text.split()) + 20}
        return JSONResponse(chat_completion(message, body.get("model", "scripted"), usage))

    @staticmethod
    def _call(name: str, arguments: dict, turn: int = 0) -> dict:
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{name}_{turn}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}]}

    def _proposer(self, name, turn, messages) -> dict:
        return self._call("propose", {"instructions": [{"instruction": p, "rationale": "from the pool"}
                                                       for p in PROPOSALS]})

    def _pruner(self, name, turn, messages) -> dict:
        user = messages[1]["content"]
        n = int(re.search(r"Select (\d+) of", user).group(1))
        ids = [int(i) for i in re.findall(r"^(\d+): ", user, re.M)]
        return self._call("select", {"keep": ids[:n],
                                     "discard": [{"id": i, "reason": "less diverse than the kept ones"}
                                                 for i in ids[n:]]})

    def _builder(self, name, turn, messages) -> dict:
        if turn == 0:
            return self._call("bash", {"command": write_command(task_files(name, name in self.defective))}, turn)
        return self._call("submit", {}, turn)

    def _refiner(self, name, turn, messages) -> dict:
        if turn == 0:
            fixed = {p: c for p, c in task_files(name, False).items() if p.startswith("task/tests/")}
            verdict = "environment: the verifier passed an untouched environment; it now checks the count\n"
            return self._call("bash", {"command": write_command(fixed) + f"\nprintf '{verdict}' > verdict.txt"}, turn)
        return self._call("submit", {}, turn)

    def _tester(self, name, turn, messages) -> dict:
        if turn == 0 and name and self.solve_as_tester:
            return self._call("bash", {"command": RECIPES[name]["solve"].replace("/app/", "")}, turn)
        return self._call("submit", {}, turn)
