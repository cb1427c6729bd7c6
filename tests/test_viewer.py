"""`orchard view`: the HTML report of a run, rendered by a real Chromium.

One real ToyColour episode (oracle, local backend, image observations) from `orchard eval`, plus SWE-, Claw- and
GUI-shaped trajectories (a patch report, a Claw report, a screenshot) in the same file:
the page is dumped (DOM text) and screenshotted by headless Chromium and checked for
their content; a `<script>` in an observation must stay text.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchard_gym.cli import main
from orchard_gym.trajectory import Trajectory, Turn
from tests.components import require, require_module

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOT_HEIGHT = 4000  # tall enough for the whole page
XSS = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour PNG (stdlib only)."""
    import struct

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def orchard(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "orchard_gym.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def chromium(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        flags = ["--headless", "--disable-gpu", f"--user-data-dir={profile}", "--hide-scrollbars"]
        if os.geteuid() == 0:  # Chromium refuses its sandbox as root
            flags.append("--no-sandbox")
        return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout)


def other_envs() -> list[str]:
    """Trajectories shaped as the SWE, Claw and GUI envs write them."""
    swe = Trajectory(env_id="Orchard/SWE-v0", task_id="demo__calc-1", reward=1.0, terminated=True,
                     turns=[Turn(index=0, action={"name": "bash", "arguments": {"command": "git diff"}}, tool="bash",
                                 arguments={"command": "git diff"}, observation=XSS, command="git diff",
                                 exit_code=0, duration=0.02)],
                     report={"patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n"
                                      "-    return a - b\n+    return a + b\n", "resolved": True, "reward": 1.0})
    claw = Trajectory(env_id="Orchard/Claw-v0", task_id="claw-mail-007", reward=0.5,
                      turns=[Turn(index=0, action="not a tool call", error="no action found",
                                  observation="Error: no action found.")],
                      report={"completion": 1.0, "safety": 0.0, "robustness": 0.5, "passed": False})
    shot = "data:image/png;base64," + base64.b64encode(png(64, 48, (230, 20, 20))).decode()
    gui = Trajectory(env_id="Orchard/GUI-v0", task_id="miniwob.click-button", reward=1.0, terminated=True,
                     turns=[Turn(index=0, action={"name": "left_click", "arguments": {"coordinate": [0.5, 0.5]}},
                                 tool="left_click", arguments={"coordinate": [0.5, 0.5]},
                                 observation="Click the button. · MiniWoB click-button")]).model_dump(mode="json")
    gui["turns"][0]["screenshot"] = shot
    broken = Trajectory(env_id="Orchard/SWE-v0", task_id="demo__broken", error="grading: no tests named",
                        error_kind="grading")
    return [swe.model_dump_json(), claw.model_dump_json(), json.dumps(gui), broken.model_dump_json()]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    require("chromium", None if CHROMIUM else "no chromium on PATH")
    folder = tmp_path_factory.mktemp("view")
    run = folder / "run.jsonl"
    with tempfile.TemporaryDirectory(prefix="og-view-", dir="/tmp") as root:  # short: unix socket paths
        toy = subprocess.run([sys.executable, "-m", "orchard_gym.cli", "eval", "--env", "Orchard/ToyColour-v0",
                              "--policy", "oracle", "--task-id", "colour-red", "--out", str(run)],
                             capture_output=True, text=True, timeout=300, env={**os.environ, "ORCHARD_LOCAL_ROOT": root})
    assert toy.returncode == 0, toy.stderr[-2000:]
    with run.open("a") as f:
        f.write("\n".join(other_envs()) + "\n")
    out = folder / "view"
    made = orchard("view", str(run), "--out", str(out))
    assert made.returncode == 0, made.stderr
    page = Path(made.stdout.strip())
    assert page == out / "index.html"
    dom = chromium("--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = folder / "page.png"
    taken = chromium(f"--screenshot={shot}", f"--window-size=1280,{SHOT_HEIGHT}", page.as_uri())
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    return {"run": run, "page": page, "dom": dom.stdout, "shot": shot, "toy": json.loads(run.read_text().splitlines()[0])}


def test_report_shows_every_env(report):
    dom, toy = report["dom"], report["toy"]
    assert "resolved" in dom and "5/5" not in dom and "episodes" in dom
    assert "3/5 (60.0%)" in dom  # toy (oracle), SWE, GUI resolved; Claw unresolved; one broken task
    # the real ToyColour episode: its task, its bash command and the submit
    assert toy["task_id"] in dom and toy["turns"][0]["arguments"]["command"].split()[0] in dom
    assert toy["metadata"]["task"].endswith("Then call submit.") and html.escape(toy["metadata"]["task"], quote=False) in dom
    assert ">submit<" in dom
    # SWE: the patch as a coloured diff; Claw: its report; GUI: the screenshot as a file
    assert '<span class="add">+    return a + b</span>' in dom
    assert '<span class="del">-    return a - b</span>' in dom
    assert "robustness" in dom and "claw-mail-007" in dom and "no action found" in dom
    assert "broken task" in dom and "grading: no tests named" in dom
    # screenshots: the real episode's (PNG files `orchard eval` wrote next to the run) and the GUI one's
    shots = sorted((report["run"].parent / "run-screenshots").rglob("*.png"))
    assert [p.name for p in shots] == ["reset.png", "turn-000.png", "turn-001.png"]
    assert toy["metadata"]["screenshot"].startswith("run-screenshots/colour-red-")
    images = list((report["page"].parent / "images").iterdir())
    assert len(images) == 2 and all(i.read_bytes().startswith(b"\x89PNG") for i in images)  # same picture once
    assert sorted(dom.count(f'src="images/{i.name}"') for i in images) == [1, 3]  # GUI; colour: reset + 2 turns


def test_untrusted_text_stays_text(report):
    dom = report["dom"]
    assert "pwned" not in dom.split("</title>")[0]  # no script ran (it would have set the title)
    assert "<script" not in dom and "onerror=" not in dom.replace("onerror=\"document", "")
    assert "&lt;script&gt;document.title=\"pwned\"&lt;/script&gt;" in dom


def test_screenshot_of_the_page_has_the_content(report):
    Image = require_module("train", "PIL.Image")  # Pillow comes with matplotlib (extra [train])
    import numpy as np

    pixels = np.asarray(Image.open(report["shot"]).convert("RGB")).astype(int)
    assert pixels.shape == (SHOT_HEIGHT, 1280, 3)
    colours = np.unique(pixels[..., 0] << 16 | pixels[..., 1] << 8 | pixels[..., 2])
    assert len(colours) > 50, "the page rendered (nearly) blank"
    # the summary's green "resolved" badge and the GUI episode's red screenshot are drawn
    red = int(((pixels[..., 0] > 200) & (pixels[..., 1] < 60) & (pixels[..., 2] < 60)).sum())
    assert red >= 64 * 48 * 0.9, f"only {red} red pixels: the GUI screenshot is not on the page"
    badge = (pixels == (0xda, 0xfb, 0xe1)).all(-1).sum()
    assert badge > 100, "no resolved badge drawn"


@pytest.mark.parametrize("content, why", [
    ("{not json\n", "line 1: not JSON"),
    ('{"env_id": "x"}\n', "line 1: not a trajectory (task_id: Field required"),
    ('[1, 2]\n', "line 1: a trajectory is a JSON object, not list"),
    ('\n\n', "no trajectories in it"),
    ('{"env_id": "x", "task_id": "t"}\n{"env_id": "x", "task_id": "t", "reward": "lots"}\n',
     "line 2: not a trajectory (reward: Input should be a valid number"),
    ('{"env_id": "x", "task_id": "t", "turns": [{"index": "zero"}]}\n', "line 1: not a trajectory (turns.0.index"),
])
def test_garbage_runs_fail_naming_the_line(tmp_path, content, why):
    run = tmp_path / "bad.jsonl"
    run.write_text(content)
    result = CliRunner().invoke(main, ["view", str(run), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and why in result.output, result.output
    assert not (tmp_path / "out" / "index.html").exists()


def test_missing_run_and_a_file_as_out(tmp_path):
    missing = CliRunner().invoke(main, ["view", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 1 and "cannot read" in missing.output
    run = tmp_path / "ok.jsonl"
    run.write_text(Trajectory(env_id="x", task_id="t", started_at=time.time()).model_dump_json() + "\n")
    (tmp_path / "file").write_text("")
    blocked = CliRunner().invoke(main, ["view", str(run), "--out", str(tmp_path / "file")])
    assert blocked.exit_code != 0 and "file" in blocked.output


def test_screenshot_references(tmp_path):
    """Paths relative to the run, raw base64 and data URLs become image files; non-images do not."""
    from orchard_gym.viewer import write_report

    (tmp_path / "shots").mkdir()
    (tmp_path / "shots" / "a.png").write_bytes(png(4, 4, (0, 0, 255)))
    raw = base64.b64encode(png(5, 5, (0, 255, 0))).decode()
    html_text = base64.b64encode(b"<html><script>alert(1)</script></html>").decode()
    record = Trajectory(env_id="Orchard/GUI-v0", task_id="t", turns=[Turn(index=i, action="x") for i in range(4)]).model_dump()
    record["turns"][0]["screenshot"] = "shots/a.png"
    record["turns"][1]["observation"] = {"text": "page", "screenshot": raw}
    record["turns"][2]["screenshots"] = ["data:text/html;base64," + html_text]
    record["turns"][3]["screenshot"] = "../../etc/passwd"
    run = tmp_path / "run.jsonl"
    run.write_text(json.dumps(record) + "\n")
    page = write_report(run, tmp_path / "out")
    text = page.read_text()
    assert len(list((tmp_path / "out" / "images").iterdir())) == 2
    assert text.count('class="shot"') == 2 and text.count("not a PNG/JPEG/GIF/WebP") == 2
    assert "alert(1)" not in text


def test_harness_runs_and_training_steps_are_viewable(tmp_path):
    """`orchard eval --harness` lines (a trajectory inside) and a training run's episodes
    (metadata.step) are shown, with the harness / the step as columns and a table by each."""
    from orchard_gym.viewer import load_run, write_report

    ep = Trajectory(env_id="Orchard/SWE-v0", task_id="semver-3.0.2", reward=1.0, terminated=True).model_dump(mode="json")
    harness = tmp_path / "harness.jsonl"
    harness.write_text("".join(json.dumps(line) + "\n" for line in [
        {"harness": "codex", "task_id": "semver-3.0.2", "reward": 1.0, "resolved": True, "error": None, "calls": 3,
         "seconds": 9.0, "trajectory": ep, "record": {"calls": []}},
        {"harness": "mini-swe-agent", "task_id": "semver-3.0.2", "reward": 0.0, "resolved": False,
         "error": "HarnessError: it crashed", "calls": 0, "seconds": 1.0, "trajectory": {}, "record": None}]))
    runs = load_run(harness)
    assert [r["metadata"]["harness"] for r in runs] == ["codex", "mini-swe-agent"]
    assert runs[1]["error"] == "HarnessError: it crashed"
    page = write_report(harness, tmp_path / "h").read_text()
    assert "<h3>by harness</h3>" in page and "<th>harness</th>" in page and ">codex<" in page

    steps = tmp_path / "trajectories.jsonl"
    steps.write_text("".join(Trajectory(env_id="Orchard/Toy-v0", task_id=f"write-00{i}", reward=float(i % 2),
                                        metadata={"step": i // 2}).model_dump_json() + "\n" for i in range(6)))
    page = write_report(steps, tmp_path / "s").read_text()
    assert "<h3>by step</h3>" in page and "<th>step</th>" in page
    assert page.count("<td>50.0%</td>") == 3  # each of the 3 steps: one of two resolved
