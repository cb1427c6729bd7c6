"""One oracle per MiniWoB++ family (see oracles.py for the rules they keep: read the page,
act through the screen)."""

from __future__ import annotations

import re

from .oracle_page import OracleError, Page, find, key, oracle, quoted, type_


async def _submit(p: Page, selector: str = "#area button"):
    buttons = await p.elems(selector)
    for text in ("Submit", "submit", "Login"):
        for b in buttons:
            if b["text"] == text:
                return p.click(b)
    raise OracleError(f"no submit button among {[b['text'] for b in buttons]}")


async def _one(p: Page, selector: str) -> dict:
    found = await p.elems(selector)
    if not found:
        raise OracleError(f"nothing visible matches {selector}")
    return found[0]


@oracle("click_quoted_button")
async def click_quoted_button(p: Page):
    yield p.click(find(await p.elems("#area button"), quoted(await p.query())))


@oracle("click_button_sequence")
async def click_button_sequence(p: Page):
    yield p.click(find(await p.elems("#area button"), "ONE"))
    yield p.click(find(await p.elems("#area button"), "TWO"))


@oracle("click_named_button")
async def click_named_button(p: Page):  # click-test-2: "Click button ONE."
    name = re.search(r"button (\w+)", await p.query()).group(1)
    find(await p.elems("#area button"), name)  # (a clear error if it is not there)
    yield p.click(await p.uncovered("#area button", name))  # the two may overlap: a part ONE shows


@oracle("click_only_button")
async def click_only_button(p: Page):
    yield p.click(await _one(p, "#area button"))


@oracle("click_link")
async def click_link(p: Page):
    yield p.click(find(await p.elems("#area .alink"), quoted(await p.query())))


@oracle("close_dialog")
async def close_dialog(p: Page):
    yield p.click(await _one(p, ".ui-dialog-titlebar-close"))


@oracle("dialog_button")
async def dialog_button(p: Page):
    label = quoted(await p.query())
    if label.lower() == "x":
        yield p.click(await _one(p, ".ui-dialog-titlebar-close"))
    else:
        yield p.click(find(await p.elems(".ui-dialog-buttonpane button"), label))


@oracle("select_labels")
async def select_labels(p: Page):  # click-checkboxes, click-option
    q = await p.query()
    m = re.search(r"Select (.*) and click Submit", q)
    if not m:
        raise OracleError(f"cannot read the query {q!r}")
    wanted = [] if m.group(1) == "nothing" else [w.strip() for w in m.group(1).split(",")]
    labels = await p.elems("#boxes label")
    for w in wanted:
        yield p.click(find(labels, w), fx=0.1)
    yield await _submit(p)


@oracle("click_tab")
async def click_tab(p: Page):
    n = re.search(r"Tab #(\d+)", await p.query()).group(1)
    yield p.click(find(await p.elems("#area .ui-tabs-anchor"), f"Tab #{n}"))


@oracle("click_widget")
async def click_widget(p: Page):
    kind = quoted(await p.query())
    yield p.click(await _one(p, f'#area [data-type="{kind}"]'))


@oracle("expand_and_submit")
async def expand_and_submit(p: Page):
    yield p.click(await _one(p, "#area h3"))
    yield {"name": "wait", "arguments": {"seconds": 0.5}}  # the section slides open
    yield p.click(await _one(p, "#subbtn"))


async def _fill(p: Page, selector: str, text: str):
    yield p.click(await _one(p, selector))
    yield type_(text)


@oracle("enter_quoted_text")
async def enter_quoted_text(p: Page):  # enter-text, enter-text-dynamic
    async for a in _fill(p, "#area input", quoted(await p.query())):
        yield a
    yield await _submit(p)


@oracle("enter_text_case")
async def enter_text_case(p: Page):
    q = await p.query()
    text = quoted(q)
    text = text.upper() if "upper case" in q else text.lower()
    async for a in _fill(p, "#area input", text):
        yield a
    yield await _submit(p)


@oracle("enter_password")
async def enter_password(p: Page):
    pw = quoted(await p.query())
    for sel in ("#password", "#verify"):
        async for a in _fill(p, sel, pw):
            yield a
    yield await _submit(p)


@oracle("login_user")
async def login_user(p: Page):
    user, pw = re.findall(r'"([^"]*)"', await p.query())[:2]
    async for a in _fill(p, "#username", user):
        yield a
    async for a in _fill(p, "#password", pw):
        yield a
    yield await _submit(p)


@oracle("focus_text")
async def focus_text(p: Page):
    yield p.click(await _one(p, "#area input"))


@oracle("focus_nth_text")
async def focus_nth_text(p: Page):
    n = int(re.search(r"(\d+)(st|nd|rd|th)", await p.query()).group(1))
    yield p.click((await p.elems("#area input"))[n - 1])


@oracle("enter_date")
async def enter_date(p: Page):
    m = re.search(r"(\d\d)/(\d\d)/(\d{4})", await p.query())
    yield p.click(await _one(p, "#tt"), fx=0.1)  # the month field
    yield type_("".join(m.groups()))
    yield await _submit(p)


@oracle("enter_time")
async def enter_time(p: Page):
    m = re.search(r"(\d+):(\d\d) ?(AM|PM)", await p.query())
    yield p.click(await _one(p, "#tt"), fx=0.1)  # the hour field
    yield type_(f"{int(m.group(1)):02d}{m.group(2)}{m.group(3)[0]}")
    yield await _submit(p)


@oracle("choose_list")
async def choose_list(p: Page):
    name = re.search(r"Select (.*) from the list", await p.query()).group(1)
    yield p.click(await _one(p, "#options"))
    yield type_(name)  # the open list jumps to what is typed
    yield key("Enter")
    yield await _submit(p)


@oracle("click_color")
async def click_color(p: Page):
    q = await p.query()
    m = re.search(r"Click on the (\w+) colored box", " ".join(q.split()))
    boxes = await p.elems("#area .color")
    colors = await p.read("[...document.querySelectorAll('#area .color')].map(e => getComputedStyle(e).backgroundColor)")
    if m:
        want = await p.read(f"(() => {{ const d = document.createElement('div'); d.style.color = {m.group(1)!r};"
                            "document.body.appendChild(d); const c = getComputedStyle(d).color; d.remove(); return c; })()")
    else:  # the query shows a swatch instead of a name
        want = await p.read("getComputedStyle(document.getElementById('query-color')).backgroundColor")
    yield p.click(boxes[colors.index(want)])


@oracle("use_autocomplete")
async def use_autocomplete(p: Page):
    parts = re.findall(r'"([^"]*)"', await p.query())
    start, end = parts[0], parts[1] if len(parts) > 1 else ""
    async for a in _fill(p, "#tags", start):
        yield a
    yield {"name": "wait", "arguments": {"seconds": 0.5}}  # the suggestions appear
    items = await p.elems(".ui-autocomplete li")
    pick = next((i for i in items if i["text"].startswith(start) and i["text"].endswith(end)), None)
    if pick is None:
        raise OracleError(f"no suggestion fits {start!r}..{end!r}: {[i['text'] for i in items]}")
    yield p.click(pick)
    yield await _submit(p)


@oracle("simple_arithmetic")
async def simple_arithmetic(p: Page):
    problem = (await _one(p, "#math-problem"))["text"]
    a, op, b = re.match(r"(-?\d+)\s*([-+x])\s*(-?\d+)", problem).groups()
    value = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
    async for act in _fill(p, "#math-answer", str(value)):
        yield act
    yield await _submit(p)


@oracle("simple_algebra")
async def simple_algebra(p: Page):
    problem = (await _one(p, "#math-problem"))["text"].replace(" ", "")
    lhs, rhs = problem.split("=")
    rhs = int(rhs)
    if lhs.startswith("x"):  # x+d, x-d
        d = int(lhs[2:])
        x = rhs - d if lhs[1] == "+" else rhs + d
    else:  # d+x, d-x
        m = re.match(r"(-?\d+)([-+])x", lhs)
        d = int(m.group(1))
        x = rhs - d if m.group(2) == "+" else d - rhs
    async for act in _fill(p, "#math-answer", str(x)):
        yield act
    yield await _submit(p)


@oracle("odd_or_even")
async def odd_or_even(p: Page):
    numbers = [int(e["text"]) for e in await p.elems("#numbers .display-number")]
    odd, even = await p.elems("#numbers button.odd"), await p.elems("#numbers button.even")
    for i, n in enumerate(numbers):
        yield p.click((odd if n % 2 else even)[i])
    yield p.click(await _one(p, "#submit"))


@oracle("find_word")
async def find_word(p: Page):
    n = int(re.search(r"(\d+)(st|nd|rd|th)", await p.query()).group(1))
    words = (await _one(p, "#area p"))["text"].split()
    word = re.sub(r"[^a-zA-Z]+", "", words[n - 1])
    async for act in _fill(p, "#answer-input", word):
        yield act
    yield await _submit(p)


@oracle("read_table")
async def read_table(p: Page):
    key_name = re.search(r"value of (.*) into", " ".join((await p.query()).split())).group(1)
    cells = [c["text"] for c in await p.elems("#tab td")]
    value = cells[cells.index(key_name) + 1]
    async for act in _fill(p, "#tt", value):
        yield act
    yield await _submit(p)


@oracle("identify_shape")
async def identify_shape(p: Page):
    shape = await p.read("(() => { const e = document.querySelector('#area_svg').firstElementChild;"
                         "return [e.tagName.toLowerCase(), e.textContent]; })()")
    tag, text = shape
    if tag == "text":
        kind = "digit" if text.strip().isdigit() else "letter"
    else:
        kind = {"rect": "rectangle", "circle": "circle", "polygon": "triangle", "path": "triangle"}[tag]
    yield p.click(await _one(p, f'#area-buttons [data-type="{kind}"]'))


@oracle("copy_paste")
async def copy_paste(p: Page):
    yield p.click(await _one(p, "#to-copy"))
    yield key("ctrl+a ctrl+c")
    yield p.click(await _one(p, "#answer-input"))
    yield key("ctrl+v")
    yield await _submit(p)


@oracle("grid_coordinate")
async def grid_coordinate(p: Page):
    coords = re.search(r"\((-?\d+),\s*(-?\d+)\)", await p.query())
    point = f"({coords.group(1)},{coords.group(2)})"
    yield p.click(await _one(p, f'circle[id="{point}"]'))


@oracle("use_spinner")
async def use_spinner(p: Page):
    n = int(re.search(r"Select (-?\d+)", await p.query()).group(1))
    arrow = await _one(p, ".ui-spinner-up" if n > 0 else ".ui-spinner-down")  # the page refuses typing
    for _ in range(abs(n)):
        yield p.click(arrow)
    yield await _submit(p)


@oracle("navigate_tree")
async def navigate_tree(p: Page):
    name = quoted(await p.query())
    while True:  # open the outermost closed folder on the way to the target, then look again
        path = await p.read("(() => { const t = [...document.querySelectorAll('#tree span')].find(s => "
                            f"s.textContent === {name!r}); const out = []; let li = t.parentElement.parentElement"
                            ".closest('li'); while (li) { const s = li.querySelector(':scope > span');"
                            "if (li.classList.contains('expandable')) out.unshift(s.textContent);"
                            "li = li.parentElement.closest('li'); } return out; })()")
        if not path:
            break
        folder = find(await p.elems("#tree span.folder"), path[0])
        yield p.click(folder)
        yield {"name": "wait", "arguments": {"seconds": 0.3}}
    yield p.click(find(await p.elems("#tree span"), name))
