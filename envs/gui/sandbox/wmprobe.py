"""Ask the window manager itself about its desktops, not the root-window properties it
publishes (any X client, e.g. `xprop -set` in the task's terminal, can write those).

A window the WM starts managing goes on the WM's current desktop, and the WM marks it
(_NET_WM_DESKTOP) itself; a request to move a window to a desktop is honoured only for a
desktop the WM has. So a fresh probe window, made at verification time (after
sandbox/quiesce.py ended every process of the policy, so none can answer in the WM's place):
- wm_current_desktop: the desktop the WM put the probe on;
- wm_desktops N: the probe moves to desktop N-1 (the WM has it) and not to desktop N (it has
  no more); a _NET_WM_STATE request after the second move, seen done, proves the WM got there.

    args: {"display": ":1", "checks": [{"type": "wm_desktops", "equals": 2}, ...]}
    prints [{"passed": bool, "seen": "..."}, ...] in the checks' order
"""

from __future__ import annotations

import ctypes
import json
import struct
import time

from xinput import XInput

CLIENT_MESSAGE = 33
REDIRECT_AND_NOTIFY = (1 << 20) | (1 << 19)  # SubstructureRedirectMask | SubstructureNotifyMask
SOURCE_PAGER = 2  # EWMH source indication: a pager, i.e. what the user asked for


class ClientMessage(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                ("display", ctypes.c_void_p), ("window", ctypes.c_ulong), ("message_type", ctypes.c_ulong),
                ("format", ctypes.c_int), ("data", ctypes.c_long * 5)]


class XEvent(ctypes.Union):
    _fields_ = [("xclient", ClientMessage), ("pad", ctypes.c_long * 24)]


class Probe:
    def __init__(self, display: str):
        self.x = XInput(display)
        self.x.x.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long,
                                        ctypes.POINTER(XEvent)]

    def cardinals(self, window: int, name: str) -> list[int]:
        prop = self.x.get_property(window, name)
        if not prop or prop[0] != 32:
            return []
        size = ctypes.sizeof(ctypes.c_ulong)
        return [struct.unpack_from("L", prop[1], i)[0] for i in range(0, len(prop[1]) // size * size, size)]

    def ask(self, window: int, message: str, *data: int) -> None:
        event = XEvent()
        event.xclient.type, event.xclient.send_event, event.xclient.window = CLIENT_MESSAGE, 1, window
        event.xclient.message_type, event.xclient.format = self.x.atom(message), 32
        for i, value in enumerate(data):
            event.xclient.data[i] = value
        self.x.x.XSendEvent(self.x.dpy, self.x.root, 0, REDIRECT_AND_NOTIFY, ctypes.byref(event))
        self.x.sync()

    @staticmethod
    def until(predicate, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def desktop(self, window: int) -> int | None:
        values = self.cardinals(window, "_NET_WM_DESKTOP")
        return values[0] if values else None

    def has_desktops(self, window: int, n: int) -> tuple[bool, str]:
        self.ask(window, "_NET_WM_DESKTOP", n - 1, SOURCE_PAGER)
        moved = self.until(lambda: self.desktop(window) == n - 1)
        self.ask(window, "_NET_WM_DESKTOP", n, SOURCE_PAGER)
        above = self.x.atom("_NET_WM_STATE_ABOVE")
        self.ask(window, "_NET_WM_STATE", 1, above, 0, SOURCE_PAGER)  # 1: add
        synced = self.until(lambda: above in self.cardinals(window, "_NET_WM_STATE"))
        beyond = self.desktop(window) == n
        seen = f"desktop {n - 1}: {'yes' if moved else 'no'}; desktop {n}: {'yes' if beyond else 'no'}"
        if not synced:
            return False, "the window manager did not answer"
        return moved and not beyond, seen


def main(args: dict) -> None:
    probe = Probe(args["display"])
    window = probe.x.map_window()
    out = []
    try:
        managed = probe.until(lambda: probe.x.get_property(window, "WM_STATE", 2) is not None
                              and probe.desktop(window) is not None, timeout=20)
        current = probe.desktop(window)
        for check in args["checks"]:
            want = int(check["equals"])
            if not managed:
                out.append({"passed": False, "seen": "no window manager managed a new window"})
            elif check["type"] == "wm_current_desktop":
                out.append({"passed": current == want, "seen": f"new windows go on desktop {current}"})
            else:
                passed, seen = probe.has_desktops(window, want)
                out.append({"passed": passed, "seen": seen})
    finally:
        probe.x.destroy_window(window)
    print(json.dumps(out))
