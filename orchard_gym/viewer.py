"""A static HTML report of a run: the trajectories JSONL that `orchard eval` writes.

    from orchard_gym.viewer import write_report
    index = write_report("runs/eval.jsonl", "runs/eval-view")   # -> runs/eval-view/index.html

One page: a run summary on top (episodes, resolved, mean reward and steps, errors, a
table of episodes), then per episode its task, reward, report and every turn (action,
observation, command, exit code, duration, error, the prompt when recorded, a
screenshot for GUI episodes, the patch of SWE episodes as a coloured diff).

Everything from the run is untrusted text (observations are whatever a sandbox printed),
so every value is HTML-escaped, and the page carries a Content-Security-Policy that
allows no script at all. Screenshots become files under OUT/images/: a turn's
`screenshot` (or `screenshots`, or an `observation` dict with a `screenshot`) may be a
`data:image/...;base64,` URL, raw base64 PNG/JPEG, or a path relative to the JSONL.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import html
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .errors import OrchardError
from .trajectory import Trajectory

MAX_TEXT = 20_000  # characters of one observation/report value shown before cutting
IMAGE_TYPES = {"png": b"\x89PNG\r\n\x1a\n", "jpeg": b"\xff\xd8\xff", "gif": b"GIF8", "webp": b"RIFF"}


class ViewerError(OrchardError):
    """The run file cannot be read or has lines that are not trajectories."""


# ---------------------------------------------------------------------------- reading
def load_run(path: str | Path) -> list[dict]:
    """The trajectories of a JSONL file, as validated dicts (extra fields kept: screenshots).
    Raises ViewerError naming every bad line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise ViewerError(f"cannot read {path}: {e.strerror or e}") from None
    episodes, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"line {number}: not JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(raw, dict):
            problems.append(f"line {number}: a trajectory is a JSON object, not {type(raw).__name__}")
            continue
        raw = _harness_run(raw)
        try:
            Trajectory.model_validate(_validatable(raw))
        except ValidationError as e:
            why = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'record'}: {err['msg']}" for err in e.errors()[:3])
            problems.append(f"line {number}: not a trajectory ({why})")
            continue
        episodes.append({**raw, "_line": number})
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise ViewerError(f"{path}: " + "; ".join(problems[:10]) + more)
    if not episodes:
        raise ViewerError(f"{path}: no trajectories in it (empty file?)")
    return episodes


def _harness_run(raw: dict) -> dict:
    """A line of `orchard eval --harness` ({"harness", "trajectory", "record", ...}) -> its trajectory,
    the harness and call count in its metadata; other lines as they are."""
    if not ("harness" in raw and isinstance(raw.get("trajectory"), dict)):
        return raw
    t = raw["trajectory"] or {"env_id": "?", "task_id": raw.get("task_id", "?")}  # the run failed before an episode
    meta = {**(t.get("metadata") or {}), "harness": raw["harness"], "calls": raw.get("calls")}
    return {**t, "metadata": meta, "reward": raw.get("reward", t.get("reward", 0.0)),
            "error": raw.get("error") or t.get("error")}


def _validatable(raw: dict) -> dict:
    """A GUI turn may hold its observation as `{"text", "screenshot"}`: validate its text."""
    turns = raw.get("turns")
    if not isinstance(turns, list) or not any(isinstance(t, dict) and isinstance(t.get("observation"), dict)
                                              for t in turns):
        return raw
    return {**raw, "turns": [{**t, "observation": str(t["observation"].get("text", ""))}
                             if isinstance(t, dict) and isinstance(t.get("observation"), dict) else t for t in turns]}


# ---------------------------------------------------------------------------- images
def _image_bytes(value: Any, base: Path) -> tuple[bytes, str] | None:
    """A screenshot reference -> (bytes, extension), or None when it is not one we can show."""
    if not isinstance(value, str) or not value:
        return None
    data = None
    if value.startswith("data:"):
        head, _, payload = value.partition(",")
        if ";base64" not in head:
            return None
        data = _b64(payload)
    elif len(value) > 256 or not Path(value).suffix:
        data = _b64(value)
    else:
        file = (base / value).resolve()
        try:
            data = file.read_bytes() if file.is_file() else None
        except OSError:
            data = None
    if not data:
        return None
    for ext, magic in IMAGE_TYPES.items():
        if data.startswith(magic):
            return data, ext
    return None  # not an image: never handed to the browser as one


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None


def turn_screenshots(turn: dict) -> list[Any]:
    shots: list[Any] = []
    for key in ("screenshot", "screenshots"):
        value = turn.get(key)
        shots += value if isinstance(value, list) else [value] if value else []
    obs = turn.get("observation")
    if isinstance(obs, dict) and obs.get("screenshot"):
        shots.append(obs["screenshot"])
    return shots


class _Images:
    """Writes screenshots under OUT/images/, named by content hash (the same image once)."""

    def __init__(self, out: Path, base: Path):
        self.dir, self.base, self.count = out / "images", base, 0

    def src(self, value: Any) -> str | None:
        found = _image_bytes(value, self.base)
        if found is None:
            return None
        data, ext = found
        name = f"{hashlib.sha256(data).hexdigest()[:20]}.{ext}"
        self.dir.mkdir(parents=True, exist_ok=True)
        target = self.dir / name
        if not target.exists():
            target.write_bytes(data)
        self.count += 1
        return f"images/{name}"


# ---------------------------------------------------------------------------- HTML pieces
def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        value = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(value) > limit:
        value = value[:limit] + f"\n… [{len(value) - limit} more characters not shown]"
    return value


def pre(value: Any, cls: str = "") -> str:
    text = _text(value)
    if looks_like_diff(text):
        return diff_html(text)
    return f'<pre class="{cls}">{esc(text)}</pre>'


def looks_like_diff(text: str) -> bool:
    return text.startswith(("diff --git", "--- ")) or "\ndiff --git " in text[:2000]


def diff_html(text: str) -> str:
    rows = []
    for line in _text(text).splitlines():
        cls = ("add" if line.startswith("+") and not line.startswith("+++") else
               "del" if line.startswith("-") and not line.startswith("---") else
               "hunk" if line.startswith("@@") else "meta" if line.startswith(("diff ", "+++", "---", "index ")) else "")
        rows.append(f'<span class="{cls}">{esc(line)}</span>')
    return '<pre class="diff">' + "\n".join(rows) + "</pre>"


def _action_html(turn: dict) -> str:
    if turn.get("tool"):
        args = turn.get("arguments") or {}
        command = args.get("command") if isinstance(args, dict) else None
        body = pre(command) if isinstance(command, str) and len(args) == 1 else pre(args)
        return f'<div class="tool">{esc(turn["tool"])}</div>{body}'
    return pre(turn.get("action"))


def _observation_text(turn: dict) -> Any:
    obs = turn.get("observation")
    if isinstance(obs, dict):
        return obs.get("text", {k: v for k, v in obs.items() if k != "screenshot"})
    return obs if obs not in (None, "") else "(empty)"


def turn_html(turn: dict, images: _Images) -> str:
    facts = [f"turn {esc(turn.get('index', '?'))}"]
    if turn.get("exit_code") is not None:
        facts.append(f'exit <b class="{"ok" if turn["exit_code"] == 0 else "bad"}">{esc(turn["exit_code"])}</b>')
    facts.append(f"{float(turn.get('duration') or 0):.2f}s")
    shots = []
    for shot in turn_screenshots(turn):
        src = images.src(shot)
        shots.append(f'<img class="shot" src="{esc(src)}" alt="screenshot after turn {esc(turn.get("index"))}">'
                     if src else '<div class="error">(a screenshot that is not a PNG/JPEG/GIF/WebP image)</div>')
    parts = [f'<div class="turn"><div class="facts">{" · ".join(facts)}</div>',
             '<div class="cols"><div><h4>action</h4>', _action_html(turn), "</div>",
             "<div><h4>observation</h4>", pre(_observation_text(turn)), *shots, "</div></div>"]
    if turn.get("command"):
        command = turn["command"]
        shown = " ".join(command) if isinstance(command, list) else command
        parts.append(f'<details><summary>command</summary>{pre(shown)}</details>')
    if turn.get("error"):
        parts.append(f'<div class="error">error: {esc(turn["error"])}</div>')
    if turn.get("messages"):
        parts.append(f'<details><summary>prompt ({len(turn["messages"])} messages)</summary>'
                     f'{pre(_messages_text(turn["messages"]))}</details>')
    parts.append("</div>")
    return "".join(parts)


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return _text(messages)
    out = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(repr(m))
            continue
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: images stand as a placeholder
            content = "".join(p.get("text", "") if p.get("type") == "text" else f"[{p.get('type')}]"
                              for p in content if isinstance(p, dict))
        calls = "".join(f"\n→ {c.get('function', {}).get('name')}({c.get('function', {}).get('arguments')})"
                        for c in m.get("tool_calls") or [] if isinstance(c, dict))
        out.append(f"[{m.get('role')}] {content or ''}{calls}")
    return "\n\n".join(out)


def _outcome(ep: dict) -> tuple[str, str]:
    if ep.get("error"):
        return ("broken task", "bad") if ep.get("error_kind") == "grading" else ("error", "bad")
    if (ep.get("report") or {}).get("tampering"):  # SWE: reached for the test runner (0.0), as `orchard eval` counts
        return ("tampering", "bad")
    passed = (ep.get("report") or {}).get("passed", float(ep.get("reward") or 0) > 0)  # as `orchard eval` counts
    return ("resolved", "ok") if passed else ("unresolved", "meh")


def _task_text(ep: dict) -> str | None:
    meta = ep.get("metadata") or {}
    if isinstance(meta.get("task"), str):
        return meta["task"]
    for turn in ep.get("turns") or []:
        for m in turn.get("messages") or []:
            if isinstance(m, dict) and m.get("role") == "user":
                return _messages_text([m])[len("[user] "):]
    return None


def episode_html(n: int, ep: dict, images: _Images) -> str:
    label, cls = _outcome(ep)
    seconds = (ep.get("ended_at") or ep.get("started_at") or 0) - (ep.get("started_at") or 0)
    head = (f'<h2 id="ep{n}">#{n} {esc(ep["task_id"])} <span class="badge {cls}">{label}</span></h2>'
            f'<div class="facts">{esc(ep["env_id"])} · reward {float(ep.get("reward") or 0):.3f} · '
            f'{len(ep.get("turns") or [])} turns · {seconds:.1f}s · sandbox {esc(ep.get("sandbox_id") or "-")}'
            f'{" · terminated" if ep.get("terminated") else ""}{" · truncated" if ep.get("truncated") else ""}'
            f' · line {ep["_line"]}</div>')
    parts = [f'<section class="episode">{head}']
    task = _task_text(ep)
    if task:
        parts.append(f"<h3>task</h3>{pre(task)}")
    first = (ep.get("metadata") or {}).get("screenshot")  # the first observation's picture
    src = images.src(first) if first else None
    if src:
        parts.append(f'<img class="shot" src="{esc(src)}" alt="the first screenshot">')
    if ep.get("error"):
        parts.append(f'<div class="error">{label}: {esc(ep["error"])}</div>')
    parts.append("".join(turn_html(t, images) for t in ep.get("turns") or []))
    report = dict(ep.get("report") or {})
    if report:
        patch = report.pop("patch", None)
        parts.append("<h3>report</h3>" + _report_table(report))
        if isinstance(patch, str) and patch:
            parts.append("<h3>submitted patch</h3>" + diff_html(patch))
    metadata = {k: v for k, v in (ep.get("metadata") or {}).items() if k not in ("task", "screenshot")}
    if metadata:
        parts.append(f"<details><summary>metadata</summary>{pre(metadata)}</details>")
    parts.append("</section>")
    return "".join(parts)


def _report_table(report: dict) -> str:
    rows = []
    for key, value in report.items():
        cell = esc(value) if isinstance(value, (int, float, bool)) or value is None else pre(value)
        rows.append(f"<tr><th>{esc(key)}</th><td>{cell}</td></tr>")
    return '<table class="report">' + "".join(rows) + "</table>"


def summary_html(name: str, episodes: list[dict]) -> str:
    n = len(episodes)
    outcomes = [_outcome(ep)[0] for ep in episodes]
    resolved = outcomes.count("resolved")
    envs = sorted({ep["env_id"] for ep in episodes})
    mean_reward = sum(float(ep.get("reward") or 0) for ep in episodes) / n
    mean_steps = sum(len(ep.get("turns") or []) for ep in episodes) / n
    starts = [ep["started_at"] for ep in episodes if ep.get("started_at")]
    ends = [ep.get("ended_at") or ep["started_at"] for ep in episodes if ep.get("started_at")]
    wall = (max(ends) - min(starts)) if starts else 0.0
    stats = [("episodes", n), ("env", ", ".join(envs)), ("resolved", f"{resolved}/{n} ({resolved / n:.1%})"),
             ("mean reward", f"{mean_reward:.3f}"), ("mean turns", f"{mean_steps:.1f}"),
             ("errors", outcomes.count("error")), ("broken tasks", outcomes.count("broken task")),
             ("tampering", outcomes.count("tampering")),
             ("wall time", f"{wall:.1f}s")]
    cards = "".join(f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>'
                    for k, v in stats)
    # extra dimensions where the file has them: a training run's step, a harness comparison's harness
    dims = [k for k in ("step", "policy", "train_harness", "harness") if any(k in (ep.get("metadata") or {}) for ep in episodes)]
    rows = "".join(
        f'<tr><td><a href="#ep{i}">#{i}</a></td>'
        + "".join(f'<td>{esc((ep.get("metadata") or {}).get(k, ""))}</td>' for k in dims)
        + f'<td>{esc(ep["task_id"])}</td><td>{esc(ep["env_id"])}</td>'
        f'<td>{float(ep.get("reward") or 0):.3f}</td><td>{len(ep.get("turns") or [])}</td>'
        f'<td><span class="badge {_outcome(ep)[1]}">{_outcome(ep)[0]}</span></td></tr>'
        for i, ep in enumerate(episodes, 1))
    return (f'<h1>{esc(name)}</h1><div class="cards">{cards}</div>' + "".join(_by_html(k, episodes) for k in dims)
            + '<table class="episodes"><tr><th></th>' + "".join(f"<th>{k}</th>" for k in dims)
            + f'<th>task</th><th>env</th><th>reward</th><th>turns</th><th>outcome</th></tr>{rows}</table>')


def _by_html(key: str, episodes: list[dict]) -> str:
    """Episodes, resolved share and mean reward per value of metadata[KEY] (a step, a harness)."""
    groups: dict[Any, list[dict]] = {}
    for ep in episodes:
        groups.setdefault((ep.get("metadata") or {}).get(key, "-"), []).append(ep)
    rows = "".join(
        f"<tr><td>{esc(value)}</td><td>{len(eps)}</td>"
        f"<td>{sum(_outcome(e)[0] == 'resolved' for e in eps) / len(eps):.1%}</td>"
        f"<td>{sum(float(e.get('reward') or 0) for e in eps) / len(eps):.3f}</td></tr>"
        for value, eps in sorted(groups.items(), key=lambda kv: (isinstance(kv[0], str), kv[0])))
    return (f'<h3>by {esc(key)}</h3><table class="by-{esc(key)}"><tr><th>{esc(key)}</th><th>episodes</th>'
            f"<th>resolved</th><th>mean reward</th></tr>{rows}</table>")


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:16px;color:#1d232a;background:#f6f7f9}
h1{font-size:22px;margin:4px 0 12px} h2{font-size:17px;margin:0 0 4px} h3{font-size:14px;margin:12px 0 4px}
h4{font-size:12px;margin:0 0 2px;color:#5b6570;text-transform:uppercase;letter-spacing:.04em}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:12px}
.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:8px 12px;min-width:110px}
.card .k{color:#5b6570;font-size:12px} .card .v{font-size:18px;font-weight:600}
table{border-collapse:collapse;background:#fff;width:100%} td,th{border:1px solid #dde1e6;padding:3px 8px;
text-align:left;vertical-align:top} table.report th{width:180px;color:#5b6570;font-weight:500}
.episode{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:12px;margin:16px 0}
.facts{color:#5b6570;font-size:12px;margin-bottom:6px}
.turn{border-top:1px dashed #dde1e6;padding:8px 0}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:10px}
pre{background:#f0f2f5;border-radius:4px;padding:6px 8px;margin:0;white-space:pre-wrap;word-break:break-word;
max-height:420px;overflow:auto;font:12px/1.4 ui-monospace,monospace}
.tool{font-weight:600;color:#2357a5;margin-bottom:2px}
.diff .add{color:#116329;background:#dafbe1} .diff .del{color:#a40e26;background:#ffebe9}
.diff .hunk{color:#8250df} .diff .meta{color:#5b6570;font-weight:600}
.badge{font-size:12px;border-radius:10px;padding:1px 8px;vertical-align:middle}
.ok{color:#116329} .badge.ok{background:#dafbe1} .bad{color:#a40e26} .badge.bad{background:#ffebe9}
.badge.meh{background:#eaeef2;color:#5b6570}
.error{color:#a40e26;background:#ffebe9;border-radius:4px;padding:4px 8px;margin:4px 0}
img.shot{max-width:100%;border:1px solid #dde1e6;margin-top:6px;display:block}
summary{cursor:pointer;color:#5b6570;font-size:12px;margin-top:4px}
"""

# no script may run on this page, whatever a trajectory contains; images only from our own folder
CSP = "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def render(name: str, episodes: list[dict], images: _Images) -> str:
    body = summary_html(name, episodes) + "".join(episode_html(i, ep, images) for i, ep in enumerate(episodes, 1))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{esc(name)} · orchard run</title><style>{CSS}</style></head><body>{body}</body></html>")


def write_report(run: str | Path, out: str | Path | None = None) -> Path:
    """Read RUN (JSONL trajectories) and write OUT/index.html (+ OUT/images/, named by content: files
    already there are kept). Returns the page's path."""
    run = Path(run)
    episodes = load_run(run)
    out = Path(out) if out is not None else run.with_name(run.stem + "-view")
    if out.exists() and not out.is_dir():
        raise ViewerError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    images = _Images(out, run.parent)
    page = out / "index.html"
    page.write_text(render(run.name, episodes, images), encoding="utf-8")
    return page

