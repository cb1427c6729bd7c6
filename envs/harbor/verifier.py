"""Running a task's verifier (Harbor's `tests/test.sh`) where the policy cannot reach it.

The policy is an adversary: whatever it left in the sandbox must not decide how the verifier
runs or what reward it reports. After the agent finished, `run_verifier`:

1. stops every process the policy left (SIGSTOP all, then SIGKILL, until none is left), so no
   background process can write a reward or edit the tests later;
2. makes the verifier's folders now, fresh: the tests and `logs/verifier` (where the reward file
   goes) never existed during the episode, so nothing can be planted in them. In a container they
   are Harbor's `/tests` and `/logs/verifier`; on the local backend (host userland, no `/tests`)
   they live in a new folder of the sandbox's private `/tmp`, after every file the policy left in
   that `/tmp` is removed (no `conftest.py`, `pytest.ini`, `node_modules` ... above them);
3. uploads the task's `tests/` there (the policy never saw them);
4. runs `bash test.sh` from the tests folder (not the policy's working directory) with an
   environment made here: PATH without the working directory or `/tmp`, fresh HOME and TMPDIR,
   `PYTHONSAFEPATH=1` and `PYTHONNOUSERSITE=1` (what `python -I` does for every interpreter the
   verifier starts: no current directory or script folder on `sys.path`, no user site) and
   `PYTHONPATH` = the tests folder (so a test script still imports its own helpers);
5. stops whatever the verifier's run left behind (a program of the policy's it tested may fork),
   then reads the reward from `logs/verifier/reward.txt` (else `reward.json`, its "reward" key;
   else the mean of its keys; every key is in the report). The verifier's output is kept for the report, never parsed for a reward.

No reward file, or one that is not a finite number, raises `GradingFailed`: the episode is
errored, never scored 0.0.
"""

from __future__ import annotations

import base64
import io
import json
import math
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from orchard_gym._loop import run_in_thread
from orchard_gym.client import AsyncSandboxInstance
from orchard_gym.errors import SandboxFailed

# Kills every process of the sandbox but this script's own ancestry (the agent and the shell
# running it): stop them all first so none can fork or restart another, then kill.
KILL_ALL = r"""
keep=" $$ "; p=$$
while [ "$p" -gt 1 ]; do set -- $(cat /proc/$p/stat 2>/dev/null || echo x x x 1); p=$4; keep="$keep$p "; done
keep="$keep 1 "
for round in 1 2 3 4 5 6 7 8 9 10; do
  found=""
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    case "$keep" in *" $pid "*) continue;; esac
    set -- $(cat "$d/stat" 2>/dev/null) || continue
    [ "$#" -ge 3 ] && [ "$3" != Z ] || continue  # gone, or a zombie waiting for init to reap it
    found="$found $pid"
  done
  [ -z "$found" ] && exit 0
  kill -STOP $found 2>/dev/null; kill -KILL $found 2>/dev/null; sleep 0.2
done
echo "processes left: $found" >&2; exit 1
"""

# Container: Harbor's own paths, made again; HOME and TMPDIR in a new folder of their own.
FRESH_HARBOR = r"""
set -e
rm -rf /tests /logs/verifier
mkdir -p /tests /logs/verifier
root=$(mktemp -d /orchard-verifier-XXXXXXXX)
mkdir "$root/home" "$root/tmp"
echo "$root"
"""

# Local: the sandbox's /tmp is private to it, and the one place besides the working directory
# the policy could write. Remove every file the policy left there (rm --one-file-system leaves
# the bind-mounted working directory alone; only the folders leading to it stay), check that no
# file is left, then make the verifier's folder.
FRESH_PRIVATE = r"""
chmod 1777 /tmp 2>/dev/null
for e in /tmp/* /tmp/.[!.]* /tmp/..?*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  find "$e" -xdev -type d ! -perm -u=rwx -exec chmod u+rwx {} \; 2>/dev/null  # a folder made unwritable
  rm -rf --one-file-system -- "$e" 2>/dev/null
done
left=$(find /tmp -xdev -mindepth 1 ! -type d -print -quit)
[ -z "$left" ] || { echo "cannot empty /tmp: $left is left" >&2; exit 1; }
set -e
root=$(mktemp -d /tmp/orchard-verifier-XXXXXXXX)
mkdir -p "$root/tests" "$root/logs/verifier" "$root/home" "$root/tmp"
echo "$root"
"""


class GradingFailed(SandboxFailed):
    """The verifier gave no usable reward: the trajectory is errored, not scored."""


@dataclass(frozen=True)
class VerifierDirs:
    """Where this run's verifier lives: all made after the policy's processes were killed."""

    root: str
    tests: str
    logs: str  # Harbor's /logs: the reward file goes to logs/verifier

    @property
    def reward_dir(self) -> str:
        return f"{self.logs}/verifier"


def tar_folder(folder: Path, transform: Callable[[Path], bytes | None] = lambda p: None) -> bytes:
    """A gzip tar of `folder`; `transform(path)` may give a file's content instead of its own."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            data = transform(path) if path.is_file() else None
            if data is None:
                tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
            else:
                info = tar.gettarinfo(str(path), arcname=str(path.relative_to(folder)))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def safe_path(path: str, unsafe: list[str]) -> str:
    """PATH without relative entries and without entries under `unsafe` folders (policy-writable)."""
    def ok(entry: str) -> bool:
        return entry.startswith("/") and not any(entry == u or entry.startswith(u.rstrip("/") + "/") for u in unsafe)
    return ":".join(e for e in path.split(":") if ok(e)) or "/usr/local/bin:/usr/bin:/bin"


def verifier_env(dirs: VerifierDirs, path: str) -> dict[str, str]:
    """The verifier's environment: nothing from the policy, `python -I` semantics for every interpreter."""
    return {"PATH": path, "HOME": f"{dirs.root}/home", "TMPDIR": f"{dirs.root}/tmp", "PWD": dirs.tests,
            "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1", "PYTHONPATH": dirs.tests,
            "PYTHONSTARTUP": "", "PYTHONHOME": "", "BASH_ENV": "", "ENV": "", "CDPATH": ""}


async def _sh(sandbox: AsyncSandboxInstance, script: str, what: str, timeout: float = 60) -> str:
    r = await sandbox.exec(script, timeout=timeout)
    if r.exit_code != 0 or r.timed_out:
        raise GradingFailed(f"{what}: {(r.stderr or r.stdout)[-500:]}")
    return r.stdout


async def stop_all(sandbox: AsyncSandboxInstance, whose: str) -> None:
    await _sh(sandbox, KILL_ALL, f"{whose} processes could not all be killed")


async def fresh_dirs(sandbox: AsyncSandboxInstance, private_tmp: bool) -> VerifierDirs:
    """The verifier's folders, made now (see the module docstring, step 2)."""
    out = await _sh(sandbox, FRESH_PRIVATE if private_tmp else FRESH_HARBOR, "cannot make the verifier's folders")
    root = out.strip().splitlines()[-1] if out.strip() else ""
    if not root.startswith("/"):
        raise GradingFailed(f"cannot make the verifier's folders: got {out[-200:]!r}")
    if private_tmp:
        return VerifierDirs(root=root, tests=f"{root}/tests", logs=f"{root}/logs")
    return VerifierDirs(root=root, tests="/tests", logs="/logs")


async def upload_tests(sandbox: AsyncSandboxInstance, folder: Path, dirs: VerifierDirs,
                       transform: Callable[[Path], bytes | None]) -> None:
    # through a command's stdin: the file API reaches only the working directory, the policy's
    archive = base64.b64encode(await run_in_thread(tar_folder, folder, transform)).decode()
    r = await sandbox.exec(["sh", "-c", 'base64 -d | tar -xz -C "$1"', "sh", dirs.tests], stdin=archive, timeout=120)
    if r.exit_code != 0:
        raise GradingFailed(f"cannot upload {folder.name}/ to {dirs.tests}: {r.stderr[-500:]}")


# the first reward file there is, after a line with its name (exit 3: none)
READ_REWARD = 'for n in reward.txt reward.json; do [ -f "$1/$n" ] && { echo "$n"; exec cat "$1/$n"; }; done; exit 3'


def scalar_reward(rewards: dict) -> float:
    """One number from Harbor's rewards dict: its "reward" key, else the mean of its keys (all kept
    in the report). As in Harbor 0.25's verifier, every key must be a finite number (JSON true/false
    count as numbers there): a text value makes the file unreadable (Harbor: VerifierOutputParseError);
    without "reward", a true/false key does too (no mean of those)."""
    odd = sorted(k for k, v in rewards.items() if not isinstance(v, (int, float)) or not math.isfinite(v))
    if odd:
        raise ValueError(f"key(s) {', '.join(map(repr, odd))} not a finite number (Harbor needs every key to be one)")
    if "reward" in rewards:
        return float(rewards["reward"])
    if not rewards or any(isinstance(v, bool) for v in rewards.values()):  # every key is a number by now
        raise ValueError("no 'reward' key, and not every key is a number to average")
    return sum(float(v) for v in rewards.values()) / len(rewards)


async def read_reward(sandbox: AsyncSandboxInstance, dirs: VerifierDirs, report: dict) -> float:
    """The reward from the verifier's own file: reward.txt, else reward.json's "reward"."""
    r = await sandbox.exec(["sh", "-c", READ_REWARD, "sh", dirs.reward_dir], timeout=60)
    if r.exit_code == 3:
        raise GradingFailed(f"the verifier wrote no reward file ({dirs.reward_dir}/reward.txt or reward.json); "
                            f"test.sh exited {report.get('test_exit_code')}: {report.get('test_output', '')[-500:]}")
    name, _, text = r.stdout.partition("\n")
    if r.exit_code != 0 or name not in ("reward.txt", "reward.json"):
        raise GradingFailed(f"cannot read the reward file in {dirs.reward_dir}: {r.stderr[-500:]}")
    text = text.strip()
    try:
        if name == "reward.json":
            parsed = json.loads(text)
            report["reward_json"] = parsed if isinstance(parsed, dict) else {"reward": parsed}
            value = scalar_reward(report["reward_json"])
        else:
            value = float(text)
    except (ValueError, TypeError, KeyError) as e:
        raise GradingFailed(f"the reward file {name} is not a number: {text[:200]!r} ({type(e).__name__}: {e})") from None
    if not math.isfinite(value):
        raise GradingFailed(f"the reward file {name} is not a finite number: {text[:200]!r}")
    return value


async def run_verifier(sandbox: AsyncSandboxInstance, tests: Path, *, private_tmp: bool, path: str, workdir: str,
                       timeout: float, transform: Callable[[VerifierDirs], Callable[[Path], bytes | None]],
                       env: dict[str, str] | None = None) -> tuple[float, dict]:
    """Grade the sandbox's end state with the verifier in `tests` (its test.sh); (reward, report).

    `private_tmp`: the sandbox has no Harbor paths and a private /tmp (the local backend);
    `path`: the PATH the task's environment had at set-up; `transform(dirs)`: a per-file
    rewrite of the uploaded tests (the local backend's path mapping), None to keep a file;
    `env`: the task's variables ([environment] env, the image's ENV, [verifier] env), under the
    isolation above (which wins: a task cannot undo it)."""
    report: dict = {}
    await stop_all(sandbox, "the policy's")
    dirs = await fresh_dirs(sandbox, private_tmp)
    await upload_tests(sandbox, tests, dirs, transform(dirs))
    isolated = verifier_env(dirs, safe_path(path, [workdir, "/tmp"]))
    run = await sandbox.exec(f"bash {shlex.quote(dirs.tests)}/test.sh", cwd=dirs.tests,
                             env={**(env or {}), **isolated}, timeout=timeout)
    report.update(test_exit_code=run.exit_code, test_timed_out=run.timed_out,
                  test_output=(run.stdout + run.stderr)[-4000:])
    await stop_all(sandbox, "the verifier run's")
    report["reward"] = await read_reward(sandbox, dirs, report)
    return report["reward"], report


__all__ = ["GradingFailed", "KILL_ALL", "VerifierDirs", "run_verifier", "safe_path", "tar_folder", "verifier_env"]
