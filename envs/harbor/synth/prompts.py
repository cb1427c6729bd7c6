"""What each agent of the pipeline is told (one place, so a run's prompts can be read and tuned)."""

from __future__ import annotations

BASE_IMAGE = "localhost/orchard/bookworm:latest"  # what every Dockerfile starts FROM here (nothing is pulled)

PROPOSER_SYSTEM = (
    "You are the proposer of a task-synthesis pipeline. You draft instructions for tasks an AI agent will be "
    "given in a Linux sandbox, each to be solved with shell commands and checked by a script. Ground every "
    "instruction in the assets pool you are shown (its skills, example tasks, documents and data): concrete "
    "files, values and outcomes that a script can verify. Call the propose tool once.")

PROPOSE_TOOL = {"type": "function", "function": {
    "name": "propose",
    "description": "Append instructions to the shared store (duplicates of stored ones are dropped).",
    "parameters": {"type": "object", "required": ["instructions"], "properties": {"instructions": {
        "type": "array", "items": {"type": "object", "required": ["instruction"], "properties": {
            "instruction": {"type": "string", "description": "what the agent is asked to do, with paths under /app"},
            "rationale": {"type": "string", "description": "which assets it is grounded in; how it is verified"}}}}}}}}


def proposer_user(domain: str, pool_digest: str, known: list[str], count: int, angle: int) -> str:
    known_text = "\n".join(f"- {k}" for k in known[-50:]) or "(none yet)"
    return (f"Domain: {domain}\n\nDraft {count} new, distinct task instructions (proposer #{angle}: favour "
            f"angles other proposers may miss).\n\nAlready in the store (do not repeat them):\n{known_text}\n\n"
            f"The assets pool:\n{pool_digest}")


PRUNER_SYSTEM = (
    "You are the pruner of a task-synthesis pipeline. From the proposed instructions, select the highest-quality "
    "and most diverse ones: feasible in a Linux sandbox without the internet, verifiable by a script, unambiguous, "
    "not near-duplicates of each other. Call the select tool once, with a reason for each one you discard.")

SELECT_TOOL = {"type": "function", "function": {
    "name": "select",
    "description": "Keep the chosen instructions by id; discard the rest, each with a reason.",
    "parameters": {"type": "object", "required": ["keep"], "properties": {
        "keep": {"type": "array", "items": {"type": "integer"}},
        "discard": {"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "integer"}, "reason": {"type": "string"}}}}}}}}


def pruner_user(domain: str, candidates: list[tuple[int, str]], n: int) -> str:
    listing = "\n".join(f"{i}: {text}" for i, text in candidates)
    return f"Domain: {domain}\n\nSelect {n} of these {len(candidates)} instructions:\n{listing}"


HARBOR_FORMAT = f"""A Harbor task folder (build it in task/):
  task/instruction.md          the instruction, as the solving agent will read it (paths under /app)
  task/task.toml               schema_version = "1.4"; [task] name = "synth/SHORT-NAME"; [agent] timeout_sec = 300.0;
                               [verifier] timeout_sec = 60.0; [environment] network_mode = "no-network"
  task/environment/Dockerfile  FROM {BASE_IMAGE}, WORKDIR /app, COPY of the mock data (kept in task/environment/),
                               RUN steps for anything else the task needs (tool scripts, a mock service)
  task/tests/test.sh           the verifier: checks the end state under /app and writes 1 (solved) or 0 to
                               /logs/verifier/reward.txt (mkdir -p /logs/verifier first); it must not trust files
                               the agent could fake, and must give 0 when the agent did nothing
  task/solution/solve.sh       the reference solution (bash, runs in /app); the verifier must give it 1
Mock data must be realistic; take it from pool/ where it fits. No network: nothing is downloaded."""

BUILDER_SYSTEM = (
    "You are the builder of a task-synthesis pipeline. You turn an instruction into a fully executable task "
    "environment with a verifier and a reference solution. Work with the bash tool (each call is a fresh shell "
    "in the workshop folder) and call submit when task/ is complete.")


def builder_prompt(domain: str, instruction: str) -> str:
    return (f"Domain: {domain}\n\nInstruction to build:\n{instruction}\n\n{HARBOR_FORMAT}\n\n"
            f"The assets pool is in pool/. Write every file of task/, then submit.")


REFINER_SYSTEM = (
    "You are the refiner of a task-synthesis pipeline. A synthesized task failed its checks. Read the failures, "
    "the test rollout and its score; decide whether the environment (Dockerfile, data, verifier, solution) is "
    "defective or the instruction ambiguous, and patch task/ accordingly. Work with the bash tool and call "
    "submit when done.")


def refiner_prompt(domain: str, instruction: str, failures: list[str], rollout: str) -> str:
    listing = "\n".join(f"- {f}" for f in failures)
    return (f"Domain: {domain}\n\nThe task's instruction:\n{instruction}\n\nIts checks failed:\n{listing}\n\n"
            f"The test rollout (a separate model attempted the task):\n{rollout}\n\n{HARBOR_FORMAT}\n\n"
            f"The task folder is in task/. Patch it. Before you submit, write your finding to verdict.txt (beside "
            f"task/, not in it): 'environment', 'instruction' or 'both' and a sentence why; or 'give-up: REASON' "
            f"when the task cannot be made to work.")
