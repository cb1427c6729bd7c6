"""The code blocks of README.md and docs/*.md, and the markers that say how each one runs.

A fenced block labelled `python`, `bash` or `sh` is an example: tests/test_docs_examples.py
runs it as written. Any other label (`text`, `console`, `json`, `yaml`, `toml`, `diff`, ...)
is output or file content and is not run; an unlabelled fence is an error (say which it is).
Markers are HTML comments (invisible on the rendered page) on the lines right above the fence:

    <!-- not-run: REASON -->      never run here; the reason is required (a GPU, a real cluster)
    <!-- slow -->                 runs in the full tier only (pytest mark `slow`; also any block that
                                  needs docker, gui, harnesses, train, ...: tests/test_docs_examples.py)
    <!-- continues -->            python: runs in one process after the page's previous python block
    <!-- needs: docker, train --> components (tests/components.py): skipped where missing, failing in CI
    <!-- timeout: 300 -->         seconds (default 90)
    <!-- serve -->                an `orchard serve` (local backend, API key `secret`) runs beside the
                                  block; the block's 127.0.0.1:8000 / localhost:8000 become its free port

`python tests/doc_examples.py` prints the counts (run / not runnable, with reasons / total).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = {"python", "bash", "sh"}
MARKER = re.compile(r"^\s*<!--\s*(not-run|slow|continues|needs|timeout|serve)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,})(\S*)")
DEFAULT_TIMEOUT = 90
# containers, browsers, harness installs, training stacks: the full tier only (as tests/tiers.py)
FULL_ONLY = {"docker", "kubernetes", "swe-images", "harnesses", "claude-code", "gui", "chromium", "train"}


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    markers: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    prefix: str = ""  # the earlier python blocks this one continues

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in CODE and "not-run" not in self.markers

    @property
    def slow(self) -> bool:
        return "slow" in self.markers or bool(set(self.needs) & FULL_ONLY)

    @property
    def timeout(self) -> int:
        return int(self.markers.get("timeout") or DEFAULT_TIMEOUT)

    @property
    def needs(self) -> list[str]:
        return [n.strip() for n in self.markers.get("needs", "").split(",") if n.strip()]


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def parse(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    rel = str(path.relative_to(REPO))
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, lang = m.groups()
        j = i + 1
        while j < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[j]):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
        block = Block(rel, i + 1, lang, "\n".join(body) + "\n")
        k = i - 1
        while k >= 0 and lines[k].strip().startswith("<!--"):
            mk = MARKER.match(lines[k])
            if mk:
                block.markers[mk.group(1)] = mk.group(2) or ""
            elif re.match(r"^\s*<!--\s*(not.run|slow|contin|needs|timeout|serve)", lines[k], re.I):
                block.problems.append(f"malformed marker {lines[k].strip()!r}")
            k -= 1
        if not lang:
            block.problems.append("unlabelled fence: label it (python, bash, sh to run; text, console, json, ... "
                                  "for output and file contents)")
        if "not-run" in block.markers and not block.markers["not-run"]:
            block.problems.append("`not-run` needs a reason: <!-- not-run: needs a GPU -->")
        if block.markers and lang not in CODE:
            block.problems.append(f"markers on a `{lang}` block, which never runs")
        blocks.append(block)
        i = j + 1
    previous: Block | None = None
    for b in blocks:
        if b.lang != "python":
            continue
        if "continues" in b.markers:
            if previous is None:
                b.problems.append("`continues` with no python block before it on the page")
            else:
                b.prefix = previous.prefix + previous.code
        previous = b
    return blocks


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in parse(p)]


def continued(blocks: list[Block]) -> set[str]:
    """Blocks a later `continues` block runs as its prefix (not run on their own)."""
    out = set()
    for i, b in enumerate(blocks):
        if "continues" in b.markers:
            for a in reversed(blocks[:i]):
                if a.lang == "python" and a.page == b.page:
                    out.add(a.id)
                    break
    return out


def counts(blocks: list[Block]) -> str:
    code = [b for b in blocks if b.lang in CODE]
    run = [b for b in code if b.runnable]
    slow = [b for b in run if b.slow]
    skipped = [b for b in code if not b.runnable]
    lines = [f"{len(blocks)} blocks: {len(code)} code, {len(blocks) - len(code)} output/file content",
             f"code: {len(run)} run ({len(run) - len(slow)} fast tier, {len(slow)} slow), "
             f"{len(skipped)} marked not runnable, {len(code)} total"]
    lines += [f"  not-run {b.id}: {b.markers['not-run']}" for b in skipped]
    return "\n".join(lines)


if __name__ == "__main__":
    bs = all_blocks()
    print(counts(bs))
    bad = [f"{b.id}: {p}" for b in bs for p in b.problems]
    print("\n".join(bad), file=sys.stderr)
    sys.exit(1 if bad else 0)
