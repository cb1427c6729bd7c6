"""The oracle toolkit: what a scripted GUI oracle may read of the page (`Page`: element boxes
and texts, the query) and the actions it acts through (computer_use clicks at coordinates it
computes, typing, keys), plus the registry the MiniWoB oracles enter themselves into. The
rules they keep are in oracles.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

ORACLES: dict[str, Callable[..., AsyncIterator[dict]]] = {}

# what a user sees of an element: its text, value, state and box (page px == screen px: kiosk)
_ELEMS = """(() => { const out = [];
  for (const e of document.querySelectorAll(%s)) { const r = e.getBoundingClientRect();
    out.push({tag: e.tagName.toLowerCase(), text: (e.innerText || e.textContent || '').trim(),
      value: e.value === undefined ? null : String(e.value), type: e.type || null, id: e.id || null,
      cls: e.className && e.className.baseVal === undefined ? e.className : '', checked: !!e.checked,
      x: r.x, y: r.y, w: r.width, h: r.height, visible: r.width > 0 && r.height > 0 &&
      getComputedStyle(e).visibility !== 'hidden'}); }
  return out; })()"""


# a point of the element (found by its text) where elementFromPoint is that element: read-only
_UNCOVERED = """(() => { const b = [...document.querySelectorAll(%s)].find(e => (e.innerText || '').trim() === %s);
  if (!b) return null; const r = b.getBoundingClientRect();
  for (const fy of [0.5, 0.25, 0.75, 0.1, 0.9]) for (const fx of [0.5, 0.25, 0.75, 0.1, 0.9]) {
    const x = r.x + r.width * fx, y = r.y + r.height * fy, e = document.elementFromPoint(x, y);
    if (e === b || b.contains(e)) return [x, y]; }
  return [r.x + r.width / 2, r.y + r.height / 2]; })()"""


def oracle(name: str):
    def register(fn):
        ORACLES[name] = fn
        return fn
    return register


class Page:
    """What an oracle may read: elements' boxes and texts, the query. And how it acts."""

    def __init__(self, env):
        self.env = env

    async def elems(self, selector: str) -> list[dict]:
        return [e for e in await self.env.display.evaluate(_ELEMS % json.dumps(selector)) if e["visible"]]

    async def query(self) -> str:
        return await self.env.display.evaluate("document.getElementById('query').textContent")

    async def read(self, expression: str) -> Any:
        """A read-only expression on the page (texts, attributes, computed styles)."""
        return await self.env.display.evaluate(expression)

    async def uncovered(self, selector: str, text: str) -> dict:
        """The element of `selector` whose text is `text`, as a 1x1 box at a point of it that is
        not under another element (what a user sees of it: MiniWoB places some elements at
        random, and one may cover the middle of another)."""
        point = await self.env.display.evaluate(_UNCOVERED % (json.dumps(selector), json.dumps(text)))
        if point is None:
            raise OracleError(f"no visible {selector} with text {text!r}")
        return {"x": point[0], "y": point[1], "w": 0, "h": 0}

    def at(self, e: dict, fx: float = 0.5, fy: float = 0.5) -> list[float]:
        x, y = e["x"] + e["w"] * fx, e["y"] + e["h"] * fy
        if self.env.coordinates == "pixels":
            return [x, y]
        return [x / self.env.width, y / self.env.height]

    def click(self, e: dict, name: str = "left_click", **kw) -> dict:
        return {"name": name, "arguments": {"coordinate": self.at(e, **kw)}}


def type_(text: str) -> dict:
    return {"name": "type", "arguments": {"text": text}}


def key(keys: str) -> dict:
    return {"name": "key", "arguments": {"keys": keys}}


def quoted(text: str) -> str:
    m = re.search(r'"([^"]*)"', text)
    if not m:
        raise OracleError(f"no quoted text in the query {text!r}")
    return m.group(1)


class OracleError(RuntimeError):
    pass


def find(elems: list[dict], text: str, exact: bool = True) -> dict:
    for e in elems:
        if (e["text"] == text) if exact else (text in e["text"]):
            return e
    raise OracleError(f"no element with text {text!r} among {[e['text'] for e in elems][:10]}")
