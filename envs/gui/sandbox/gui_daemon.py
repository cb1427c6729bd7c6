"""The GUI daemon: a private X display, its programs, input and screen grabs, in one sandbox.

Uploaded by the env and run with the agent's own Python (standard library only):

    python gui_daemon.py --socket DIR/gui.sock  < config.json

It starts Xvfb (a display number of its own, no TCP, no abstract socket: only the
sandbox's private /tmp/.X11-unix sees it), openbox, and either a real Chromium window
(browser tasks; DevTools on 127.0.0.1 in the sandbox's network namespace) or the
task's desktop programs; prints one JSON line ({"ok": true, "display": ...}) and goes
to the background, serving requests on the unix socket: one JSON line in, one JSON
line out, followed by `frame` bytes of raw BGRX pixels when the answer has a screenshot
(or, for a client on the same machine that asked for it in its hello, the pixels in a
shared memory file passed over the socket, `frame_fd_bytes` long: no copy through the socket).

Input goes through the X server (xdotool, i.e. XTEST), like a user's. A Chromium that
dies is started again on the task's page; the next answer says so ("restarted").
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import http.server
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp
import page_input
from gui_server import Handler, Server
from procwatch import foreground_shells, processes, sandbox_pss_kib, waiting_for_input
import xgrab
import xinput

KEY_NAMES = {"ctrl": "ctrl", "control": "ctrl", "alt": "alt", "shift": "shift", "super": "super", "meta": "super",
             "cmd": "super", "win": "super", "enter": "Return", "return": "Return", "esc": "Escape",
             "escape": "Escape", "tab": "Tab", "backspace": "BackSpace", "delete": "Delete", "del": "Delete",
             "space": "space", "up": "Up", "down": "Down", "left": "Left", "right": "Right", "home": "Home",
             "end": "End", "pageup": "Prior", "page_up": "Prior", "pagedown": "Next", "page_down": "Next",
             "insert": "Insert", "capslock": "Caps_Lock", "plus": "plus", "minus": "minus"}
BUTTONS = {"left_click": (1, 1), "right_click": (3, 1), "middle_click": (2, 1), "double_click": (1, 2),
           "triple_click": (1, 3)}
# actions whose X input the page counts (mouseup, keyup, wheel): act() waits until it did
INPUT_ACTIONS = {*BUTTONS, "left_click_drag", "type", "key", "scroll", "hscroll"}
TASK_PORT = 17380  # the task pages' server, where it is free (the agent's port in a container is 8765)
SCROLL_NOTCH = 100  # pixels per wheel click (Chromium on X11 scrolls about this much)
URL_SCHEMES = ("http", "https", "about")
# programs whose window is a terminal: ready only once their shell waits for input
TERMINALS = {"stterm", "st", "xterm", "x-terminal-emulator", "urxvt", "rxvt"}

# Settings files the programs read from the daemon's private config home. GSettings (GIO's
# keyfile backend): Mousepad's title names the file only, never the sandbox's folder (a host
# path on the local backend) that the policy must not see. GTK: no blinking caret, so a
# screenshot does not depend on when it was taken (reset(seed=...) gives the same observation)
SETTINGS = {"glib-2.0/settings/keyfile": "[org/xfce/mousepad/preferences/window]\npath-in-title=false\n",
            "gtk-3.0/settings.ini": "[Settings]\ngtk-cursor-blink=false\n"}


def write_settings(config_home: str) -> None:
    for name, text in SETTINGS.items():
        path = os.path.join(config_home, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


class Daemon:
    def __init__(self, config: dict, home: str):
        self.cfg, self.home = config, home
        self.width, self.height = int(config.get("width", 1280)), int(config.get("height", 720))
        self.mode = config.get("mode", "browser")
        self.procs: dict[str, subprocess.Popen] = {}
        self.restarts: list[str] = []  # not yet reported
        self.crashes = 0
        self.tabs: list[str] = []
        self.active: str | None = None
        # the tab and URL the env set the task up in (load_task_page): the env's grade reads the
        # reward there, never from whatever page the policy has open
        self.task_target: str | None = None
        self.task_url: str | None = None
        self.session: cdp.Session | None = None
        self.session_target: str | None = None
        self.watcher: cdp.TargetWatcher | None = None
        self.startup: dict[str, float] = {}  # seconds each start-up wait took (the hello reports them)
        self.lock = threading.Lock()
        self.env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
                    "XDG_RUNTIME_DIR": os.path.join(home, ".gui", "xdg"), "NO_AT_BRIDGE": "1",
                    "GSETTINGS_BACKEND": "keyfile", "XDG_CONFIG_HOME": os.path.join(home, ".gui", "config")}
        os.makedirs(self.env["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
        write_settings(self.env["XDG_CONFIG_HOME"])
        self.log = open(os.path.join(home, ".gui", "programs.log"), "ab")

    # ---------------------------------------------------------------- start
    def start(self) -> dict:
        self.serve_files()
        self.start_display()
        self.grabber = xgrab.Grabber(self.display)
        self.input = xinput.XInput(self.display)
        self.spawn("openbox", ["openbox", "--sm-disable"])
        if self.cfg.get("apps"):  # (a browser task's kiosk window is its own: it starts alongside openbox)
            t = time.monotonic()
            if not self.input.window_manager_ready(timeout=60):
                raise RuntimeError("openbox did not manage windows within 60s")
            self.startup["window_manager_s"] = round(time.monotonic() - t, 2)
            self.note("openbox manages windows")
        if self.mode == "browser":
            self.start_browser()
            self.load_task_page()
        newest = None
        for i, argv in enumerate(self.cfg.get("apps", [])):
            before = self.windows()
            proc = self.spawn(f"app{i}", argv, cwd=self.cfg.get("cwd") or self.home)
            t = time.monotonic()
            newest = self.wait_for_window(before, proc, argv)
            self.startup[f"app{i}_window_s"] = round(time.monotonic() - t, 2)
            self.note(f"app{i}'s window {newest} is on screen")
            if os.path.basename(argv[0]) in TERMINALS:
                t = time.monotonic()
                self.wait_for_shell(proc)
                self.startup[f"app{i}_shell_s"] = round(time.monotonic() - t, 2)
                self.note(f"app{i}'s shell waits for input")
        if newest:  # the last program's window has the keyboard, as if the user just opened it
            subprocess.run(["xdotool", "windowactivate", "--sync", newest], env=self.env, capture_output=True,
                           timeout=30)
            self.note(f"activated {newest}")
            self.wait_quiet()
        self.note("started")
        # the stack's processes with their start times, before the policy acts: the desktop
        # verifier's clean-up (sandbox/quiesce.py) spares these and ends what else the sandbox runs
        started = processes()
        pids = {name: [pid, started.get(str(pid), {}).get("start")] for name, pid in
                [("daemon", os.getpid()), *((n, self.procs[n].pid) for n in ("xvfb", "openbox") if n in self.procs)]}
        return {"ok": True, "startup": self.startup, "display": self.display, "grab": self.grabber.method,
                "pids": pids, "width": self.width,
                "height": self.height, "http_port": getattr(self, "http_port", None),
                "devtools_port": getattr(self, "devtools_port", None)}

    def wait_quiet(self, still: float = 0.6, timeout: float = 8.0) -> None:
        """Until the screen has not changed for `still` seconds: the programs have started
        (a shell that is still starting loses what is typed into its terminal)."""
        deadline = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            frame = hash(self.grabber.grab()[2])
            if frame != last:
                last, since = frame, time.monotonic()
            elif time.monotonic() - since >= still:
                return
            time.sleep(0.1)

    def serve_files(self) -> None:
        root = self.cfg.get("serve_dir")
        if not root:
            return
        handler = functools.partial(QuietHandler, directory=root)
        try:  # one port in every sandbox: the URL the policy reads is the same at each reset(seed)
            server = http.server.ThreadingHTTPServer(("127.0.0.1", TASK_PORT), handler)
        except OSError:  # taken: a sandbox on the host's network (no namespace of its own)
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.http_port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def start_display(self) -> None:
        os.makedirs("/tmp/.X11-unix", exist_ok=True)
        read, write = os.pipe()
        argv = ["Xvfb", "-displayfd", str(write), "-screen", "0", f"{self.width}x{self.height}x24",
                "-nolisten", "tcp", "-nolisten", "local", "-noreset", "+extension", "MIT-SHM", "-dpi", "96"]
        self.procs["xvfb"] = subprocess.Popen(argv, env=self.env, stdout=self.log, stderr=self.log,
                                              stdin=subprocess.DEVNULL, pass_fds=(write,), start_new_session=True)
        os.close(write)
        number = b""
        deadline = time.monotonic() + 30
        while not number.endswith(b"\n") and time.monotonic() < deadline:
            chunk = os.read(read, 16)
            if not chunk:
                break
            number += chunk
        os.close(read)
        if not number.strip().isdigit():
            raise RuntimeError(f"Xvfb did not start (exit {self.procs['xvfb'].poll()})")
        self.display = f":{int(number)}"
        self.env["DISPLAY"] = self.display

    def note(self, text: str) -> None:
        """A start-up milestone in programs.log (what a failed start shows)."""
        self.log.write(f"[gui_daemon {time.strftime('%H:%M:%S')}] {text}\n".encode())
        self.log.flush()

    def spawn(self, name: str, argv: list[str], cwd: str | None = None) -> subprocess.Popen:
        self.note(f"starting {name}: {argv[0]}")
        proc = subprocess.Popen(argv, env=self.env, cwd=cwd or self.home, stdout=self.log, stderr=self.log,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start_browser(self) -> None:
        profile = os.path.join(self.home, ".gui", "chromium")
        port_file = os.path.join(profile, "DevToolsActivePort")
        if os.path.exists(port_file):
            os.unlink(port_file)
        binary = self.cfg.get("chromium") or shutil.which("chromium") or shutil.which("chromium-browser") or "chromium"
        argv = [binary, "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-gpu", "--disable-features=Translate,MediaRouter,OptimizationHints",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--password-store=basic", "--use-mock-keychain", "--disable-breakpad", "--noerrdialogs",
                "--disable-session-crashed-bubble", "--hide-crash-restore-bubble", "--force-device-scale-factor=1",
                f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                "--kiosk", "--window-position=0,0", f"--window-size={self.width},{self.height}", "about:blank"]
        self.spawn("chromium", argv)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.procs["chromium"].poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.procs['chromium'].returncode}")
            try:
                with open(port_file) as f:
                    self.devtools_port = int(f.readline())
                targets = self.targets()
                if targets:
                    self.tabs = [t["id"] for t in targets]
                    self.active = self.tabs[0]
                    self.watch_targets()
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port in 60s")

    def watch_targets(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        try:
            self.watcher = cdp.TargetWatcher(self.devtools_port)
        except (cdp.CDPError, OSError, ValueError, KeyError):
            self.watcher = None  # the tab list is then read over HTTP now and then

    def targets(self) -> list[dict]:
        return [t for t in cdp.http_json(self.devtools_port, "/json/list") if t.get("type") == "page"]

    def page(self) -> cdp.Session:
        if self.session is None or self.session_target != self.active:
            if self.session is not None:
                self.session.close()
            target = next((t for t in self.targets() if t["id"] == self.active), None)
            if target is None:
                raise cdp.CDPError("the active tab is gone")
            self.session, self.session_target = cdp.Session(target["webSocketDebuggerUrl"]), self.active
        return self.session

    def load_task_page(self) -> None:
        url = self.cfg.get("start_url")
        if not url:
            return
        if url.startswith("/"):
            url = f"http://127.0.0.1:{self.http_port}{url}"
        self.page().call("Page.navigate", {"url": url})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.page().evaluate("document.readyState") == "complete":
                    break
            except cdp.CDPError:
                pass
            time.sleep(0.05)
        if self.cfg.get("page_setup"):
            self.page().evaluate(self.cfg["page_setup"])
        self.task_target, self.task_url = self.active, url

    def task_page(self) -> cdp.Session:
        """A DevTools session on the task's tab (the active one's if it is active), wherever the
        policy went since. The tab closed: CDPError (the env grades that as the task abandoned)."""
        if self.task_target == self.active:
            return self.page()
        target = next((t for t in self.targets() if t["id"] == self.task_target), None)
        if target is None:
            raise TaskTabGone("the task's tab was closed")
        return cdp.Session(target["webSocketDebuggerUrl"])

    def on_task_page(self, url: str) -> bool | None:
        """Whether the policy looks at the task's page: its tab, its URL (the fragment aside).
        None: no task page (desktop tasks, pages loaded without one)."""
        if not self.task_url:
            return None
        return self.active == self.task_target and url.split("#", 1)[0] == self.task_url.split("#", 1)[0]

    def close_other_tabs(self) -> None:
        self.sync_tabs()
        for target in [t for t in self.tabs if t != self.active]:
            cdp.http_json(self.devtools_port, f"/json/close/{target}")
        self.tabs = [self.active]

    def windows(self) -> list[str]:
        r = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", "."], env=self.env,
                           capture_output=True, text=True, timeout=10)
        return r.stdout.split()

    def wait_for_window(self, before: list[str], proc: subprocess.Popen, argv: list[str],
                        timeout: float = 60) -> str:
        """The program's window, once it is on screen. Under heavy load a program can take
        tens of seconds to map it; an episode must not start before it (what is typed into
        a screen without the window is lost), so no window at all is an error."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = [w for w in self.windows() if w not in before]
            if new:
                return new[-1]
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with code {proc.returncode} before it opened a window")
            time.sleep(0.1)
        raise RuntimeError(f"{argv[0]} opened no window in {timeout:.0f}s")

    def wait_for_shell(self, proc: subprocess.Popen, timeout: float = 60) -> None:
        """Until the terminal's shell waits for input (blocked reading its tty, seen in /proc).
        Mapping its window is not enough: st creates its pty and starts the shell only after
        it has seen its own MapNotify, and drops every key event that comes before it; a
        shell that waits on its tty proves the terminal got there and reads keys."""
        deadline, ready_since = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the terminal exited with code {proc.returncode} before its shell started")
            shells = foreground_shells(proc.pid)
            if shells and all(waiting_for_input(pid) for pid in shells):
                if ready_since is None:
                    ready_since = time.monotonic()
                elif time.monotonic() - ready_since >= 0.2:  # still waiting: not a passing sleep
                    return
            else:
                ready_since = None
            time.sleep(0.05)
        raise RuntimeError(f"the terminal's shell did not wait for input within {timeout:.0f}s")

    # ---------------------------------------------------------------- health
    def check_health(self) -> None:
        if self.procs["xvfb"].poll() is not None:
            raise RuntimeError(f"the X server exited with code {self.procs['xvfb'].returncode}")
        chromium = self.procs.get("chromium")
        if chromium is not None and chromium.poll() is not None:
            code = chromium.returncode
            self.crashes += 1
            if self.session is not None:
                self.session.close()
            self.session = None
            self.start_browser()
            self.load_task_page()
            self.restarts.append(f"the browser exited (code {code}) and was restarted on the task page")

    # ---------------------------------------------------------------- actions
    def xdo(self, *args: str) -> None:
        r = subprocess.run(["xdotool", *args], env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise ValueError(f"xdotool failed: {r.stderr.strip()[-300:]}")

    def act(self, a: dict) -> str | None:
        """Do one action (already validated and in pixels); return a note for the policy, if any."""
        name = a["name"]
        if name in INPUT_ACTIONS and not (name == "type" and not a["text"]) and "chromium" in self.procs:
            evaluate, errors = (lambda js: self.page().evaluate(js)), (cdp.CDPError, OSError, ValueError)
            before = page_input.seen(evaluate, errors)
            note = self.act_now(a)
            page_input.wait_seen(evaluate, errors, before)  # the page has the input before we read it
            return note
        return self.act_now(a)

    def act_now(self, a: dict) -> str | None:
        name = a["name"]
        if name in BUTTONS:
            button, count = BUTTONS[name]
            x, y = a["coordinate"]
            self.input.click(x, y, button, count)
        elif name == "mouse_move":
            self.input.move(*a["coordinate"])
        elif name == "left_click_drag":
            (sx, sy), (ex, ey) = a["start"], a["coordinate"]
            self.input.move(sx, sy)
            time.sleep(0.03)
            self.input.button(1, True)
            for k in range(1, 6):  # intermediate moves: pages see a drag, not a jump
                time.sleep(0.03)
                self.input.move(sx + (ex - sx) * k // 5, sy + (ey - sy) * k // 5)
            time.sleep(0.03)
            self.input.button(1, False)
        elif name == "type":
            if a["text"]:
                self.xdo("type", "--delay", "8", "--", a["text"])
        elif name == "key":
            for i, c in enumerate(a["keys"]):
                if i:
                    time.sleep(0.03)
                keys = chord(c)
                if not self.input.chord(keys.split("+")):
                    self.xdo("key", "--", keys)
        elif name in ("scroll", "hscroll"):
            if a.get("coordinate"):
                self.input.move(*a["coordinate"])
            pixels = int(a["pixels"])
            notches = max(1, round(abs(pixels) / SCROLL_NOTCH))
            button = {("scroll", True): "5", ("scroll", False): "4", ("hscroll", True): "7",
                      ("hscroll", False): "6"}[(name, pixels > 0)]
            for _ in range(notches):
                self.input.button(int(button), True)
                self.input.button(int(button), False)
        elif name == "wait":
            time.sleep(min(float(a["seconds"]), 60.0))
        elif name in ("goto", "go_back", "new_tab", "tab_focus"):
            note = self.navigate(a)
            self.sync_tabs()
            return note
        else:
            raise ValueError(f"the daemon does not know the action {name!r}")
        return None

    def navigate(self, a: dict) -> str | None:
        if "chromium" not in self.procs:
            raise ValueError(f"{a['name']} needs a browser; this task is a desktop task")
        name = a["name"]
        if name == "goto":
            url = a["url"]
            if urllib.parse.urlsplit(url).scheme.lower() not in URL_SCHEMES:
                raise ValueError(f"goto only opens {', '.join(URL_SCHEMES)} URLs")
            self.page().call("Page.navigate", {"url": url})
            self.wait_loaded()
        elif name == "go_back":
            history = self.page().call("Page.getNavigationHistory")
            index = history.get("currentIndex", 0)
            if index <= 0:
                return "there is no page to go back to"
            self.page().call("Page.navigateToHistoryEntry", {"entryId": history["entries"][index - 1]["id"]})
            self.wait_loaded()
        elif name == "new_tab":
            target = cdp.http_json(self.devtools_port, "/json/new?about:blank", method="PUT")
            self.sync_tabs()
            self.active = target["id"]
            cdp.http_json(self.devtools_port, f"/json/activate/{target['id']}")
        elif name == "tab_focus":
            self.sync_tabs()
            index = int(a["index"])
            if not 0 <= index < len(self.tabs):
                raise ValueError(f"there is no tab {index}: {len(self.tabs)} tabs are open (0-based)")
            self.active = self.tabs[index]
            cdp.http_json(self.devtools_port, f"/json/activate/{self.active}")
        return None

    def wait_loaded(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        time.sleep(0.05)
        while time.monotonic() < deadline:
            try:
                if self.page().evaluate("document.readyState") in ("interactive", "complete"):
                    return
            except cdp.CDPError:
                pass
            time.sleep(0.05)

    def sync_tabs(self, exact: bool = True) -> list[dict]:
        """Tabs in the order they opened; a tab a page opened by itself becomes the active one.
        exact: ask the browser (/json/list); else the Target events' view, which may lag a
        just-opened tab by a moment, so only tabs it saw close are dropped."""
        if exact or self.watcher is None:
            targets = self.targets()
            ids = {t["id"] for t in targets}
        else:
            targets = self.watcher.targets()
            with self.watcher.lock:
                ids = {t["id"] for t in targets} | (set(self.tabs) - self.watcher.destroyed)
        self.tabs = [t for t in self.tabs if t in ids]
        for t in reversed(targets):  # /json/list lists the newest first
            if t["id"] not in self.tabs:
                self.tabs.append(t["id"])
                self.active = t["id"]
        if self.active not in ids and self.tabs:
            self.active = self.tabs[-1]
        return targets

    def settle_and_read(self, how) -> dict | None:
        """Wait as `how` says, then read the page's URL, title and done flag, all in ONE DevTools
        round trip ("frame": inside two animation frames, i.e. once what the input changed has
        been painted). None: no browser, or it did not answer (state() reads again)."""
        browser = "chromium" in self.procs
        if isinstance(how, (int, float)) and how > 0:
            time.sleep(min(float(how), 5.0))
        if not browser:
            if how == "frame":
                time.sleep(0.05)
            return None
        done = self.cfg.get("done_expr")
        read = ("[location.href, document.title, "
                + (f"(() => {{ try {{ return !!({done}); }} catch (e) {{ return false; }} }})()]" if done else "null]"))
        try:
            if how == "frame":
                result = self.page().call("Runtime.evaluate", {
                    "expression": f"new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r({read}))))",
                    "awaitPromise": True, "returnByValue": True, "timeout": 500})
                value = result.get("result", {}).get("value")
                if "exceptionDetails" in result or not isinstance(value, list):
                    value = self.page().evaluate(read)
            else:
                value = self.page().evaluate(read)
            url, title, page_done = value
            return {"url": url, "title": title, "done": page_done}
        except (cdp.CDPError, OSError, ValueError, TypeError):
            return None

    def state(self, page: dict | None = None) -> dict:
        out: dict = {"crashes": self.crashes}
        if "chromium" in self.procs:
            self.requests = getattr(self, "requests", 0) + 1
            if self.watcher is not None and self.watcher.alive:
                self.sync_tabs(exact=False)  # the Target events' view: no I/O
            elif self.requests % 5 == 0 or self.session is None:  # the tab list over HTTP: now and then
                self.sync_tabs()
            if page is None:  # the active tab's URL and title over its open DevTools socket
                url, title = self.page().evaluate("[location.href, document.title]")
            else:
                url, title = page["url"], page["title"]
            out.update(url=url, title=title, tabs=len(self.tabs),
                       tab_index=self.tabs.index(self.active) if self.active in self.tabs else None)
            if self.task_url:
                out["on_task_page"] = self.on_task_page(url)
        else:
            out["title"] = self.input.active_window_title()  # in-process: no xdotool per step
        return out

    # ---------------------------------------------------------------- requests
    def handle(self, req: dict, frame_buf: mmap.mmap | None = None) -> tuple[dict, bytes]:
        """One request. frame_buf: the client's shared frame buffer (the pixels go there)."""
        op = req.get("op")
        page = None
        marks = [("start", time.perf_counter())] if req.get("profile") else None  # bench_gui: where time goes
        with self.lock:
            self.check_health()
            reply: dict = {"ok": True}
            if op == "act":
                try:
                    note = self.act(req["action"])
                    if note:
                        reply["note"] = note
                except (ValueError, cdp.CDPError, OSError, subprocess.TimeoutExpired) as e:
                    reply = {"ok": False, "error": str(e)}
                if marks:
                    marks.append(("action", time.perf_counter()))
                page = self.settle_and_read(req.get("settle", "frame"))
                if marks:
                    marks.append(("settle_and_page_state", time.perf_counter()))
                if page is None:
                    self.check_health()
                if self.cfg.get("done_expr") and "chromium" in self.procs:
                    reply["page_done"] = bool(page and page["done"])
            elif op == "eval":  # read-only page state: oracles' DOM geometry; MiniWoB's reward (tab "task")
                try:
                    if req.get("tab") == "task":
                        session = self.task_page()
                        try:
                            reply["value"] = session.evaluate(req["expression"])
                        finally:
                            if session is not self.session:
                                session.close()
                    else:
                        reply["value"] = self.page().evaluate(req["expression"])
                except TaskTabGone as e:
                    reply = {"ok": False, "error": str(e), "task_tab_gone": True}
                except (cdp.CDPError, OSError) as e:
                    reply = {"ok": False, "error": str(e)}
            elif op == "hello":
                reply["nonce"] = self.cfg.get("nonce")
            elif op == "load":  # the next browser task in the same sandbox (a warm reset)
                try:
                    self.cfg.update(start_url=req.get("start_url"), page_setup=req.get("page_setup"),
                                    done_expr=req.get("done_expr"))
                    self.close_other_tabs()  # an episode starts on one tab, as after a cold start
                    self.load_task_page()
                except (cdp.CDPError, OSError, ValueError) as e:
                    reply = {"ok": False, "error": str(e)}
            elif op == "pids":  # the programs' pids in the sandbox's PID namespace (tests, health checks)
                reply["pids"] = {name: p.pid for name, p in self.procs.items() if p.poll() is None}
            elif op == "memory":
                reply["pss_kib"] = sandbox_pss_kib()
            elif op == "stop":
                self.stop()
                return reply, b""
            elif op == "shot":
                page = self.settle_and_read(req.get("settle", 0))
            elif op != "state":
                return {"ok": False, "error": f"unknown op {op!r}"}, b""
            if op in ("act", "shot", "state"):
                try:
                    reply["state"] = self.state(page)
                except (cdp.CDPError, OSError, ValueError) as e:
                    time.sleep(0.5)  # a browser that is dying: let it die, then start it again
                    self.check_health()
                    try:
                        reply["state"] = self.state()
                    except (cdp.CDPError, OSError, ValueError):
                        reply["state"] = {"error": str(e), "crashes": self.crashes}
            if self.restarts:
                reply["restarted"], self.restarts = self.restarts, []
            frame = b""
            if marks:
                marks.append(("state", time.perf_counter()))
            if op in ("act", "shot"):
                reply.update(width=self.width, height=self.height)
                if frame_buf is not None:
                    address = ctypes.addressof(ctypes.c_char.from_buffer(frame_buf))
                    reply["frame_fd_bytes"] = self.grabber.grab_into(address)
                else:
                    _, _, frame = self.grabber.grab()
                    reply["frame"] = len(frame)
            if marks:
                marks.append(("grab", time.perf_counter()))
                reply["profile_ms"] = {name: round((t - marks[i][1]) * 1e3, 3) for i, (name, t) in enumerate(marks[1:])}
            return reply, frame

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()


class TaskTabGone(cdp.CDPError):
    pass


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                      ".css": "text/css; charset=utf-8"}

    def log_message(self, *args) -> None:
        pass


def chord(keys) -> str:
    """'ctrl+a' or ['ctrl', 'a'] -> xdotool's 'ctrl+a'; friendly names -> X keysyms."""
    parts = keys if isinstance(keys, list) else [p for p in keys.replace(" ", "").split("+") if p] or ["plus"]
    return "+".join(KEY_NAMES.get(p.lower(), p) if len(p) > 1 else p for p in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--foreground", action="store_true")
    args = parser.parse_args()
    config = json.loads(sys.stdin.readline() or "{}")
    home = config.get("home") or os.getcwd()
    os.makedirs(os.path.join(home, ".gui"), exist_ok=True)
    # fork first (threads do not survive a fork): the child serves, the parent reports its hello
    # and exits, so the agent's command ends while the child keeps none of its pipes
    read, write = os.pipe()
    if not args.foreground and os.fork():
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            hello = pipe.read().decode() or json.dumps({"ok": False, "error": "the GUI daemon died while starting"})
        print(hello.strip(), flush=True)
        os._exit(0 if json.loads(hello).get("ok") else 1)
    os.close(read)
    daemon = Daemon(config, home)
    if not args.foreground:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(daemon.log.fileno() if fd else null, fd)
    try:
        hello = daemon.start()
        if os.path.exists(args.socket):
            os.unlink(args.socket)
        server = Server(args.socket, Handler)
        server.daemon_state = daemon
        os.chmod(args.socket, 0o600)
    except Exception as e:
        daemon.stop()
        os.write(write, json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}).encode())
        os._exit(1)
    if args.foreground:
        print(json.dumps(hello), flush=True)
    else:
        os.write(write, json.dumps(hello).encode())
    os.close(write)
    signal.signal(signal.SIGTERM, lambda *a: (daemon.stop(), os._exit(0)))
    try:
        server.serve_forever()
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
