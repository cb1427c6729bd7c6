"""Mouse and key input through the XTEST extension, in-process (ctypes, standard library).

A click is a few X requests instead of a new xdotool process (tens of ms on a busy
host); text typing and keys XTEST cannot map without remapping the keyboard still go
through xdotool (the daemon decides).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

MODIFIERS = {"ctrl": "Control_L", "alt": "Alt_L", "shift": "Shift_L", "super": "Super_L"}


class XInput:
    def __init__(self, display: str):
        self.x = ctypes.CDLL(ctypes.util.find_library("X11") or "libX11.so.6")
        self.t = ctypes.CDLL(ctypes.util.find_library("Xtst") or "libXtst.so.6")
        x, t = self.x, self.t
        x.XOpenDisplay.restype = ctypes.c_void_p
        x.XOpenDisplay.argtypes = [ctypes.c_char_p]
        x.XFlush.argtypes = [ctypes.c_void_p]
        x.XSync.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x.XStringToKeysym.restype = ctypes.c_ulong
        x.XStringToKeysym.argtypes = [ctypes.c_char_p]
        x.XKeysymToKeycode.restype = ctypes.c_ubyte
        x.XKeysymToKeycode.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
        x.XCloseDisplay.argtypes = [ctypes.c_void_p]
        t.XTestFakeMotionEvent.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_ulong]
        t.XTestFakeButtonEvent.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_ulong]
        t.XTestFakeKeyEvent.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_ulong]
        self.dpy = x.XOpenDisplay(display.encode())
        if not self.dpy:
            raise OSError(f"cannot open X display {display}")

    def sync(self) -> None:
        self.x.XSync(self.dpy, 0)

    def move(self, x: int, y: int) -> None:
        self.t.XTestFakeMotionEvent(self.dpy, -1, int(x), int(y), 0)
        self.sync()

    def button(self, button: int, down: bool) -> None:
        self.t.XTestFakeButtonEvent(self.dpy, button, 1 if down else 0, 0)
        self.sync()

    def click(self, x: int, y: int, button: int = 1, count: int = 1, gap: float = 0.06) -> None:
        self.move(x, y)
        for i in range(count):
            if i:
                time.sleep(gap)
            self.button(button, True)
            self.button(button, False)

    def keycode(self, name: str) -> int | None:
        """The keycode of a key name typed without shift (None: leave it to xdotool)."""
        name = MODIFIERS.get(name.lower(), name)
        if len(name) == 1 and not (name.islower() or name.isdigit()):
            return None  # needs shift or a remapped key
        sym = self.x.XStringToKeysym(name.encode())
        if not sym:
            return None
        code = self.x.XKeysymToKeycode(self.dpy, sym)
        return code or None

    def chord(self, keysyms: list[str]) -> bool:
        """Press keys together (modifiers first), release in reverse. False: cannot map it here."""
        codes = [self.keycode(k) for k in keysyms]
        if not codes or None in codes:
            return False
        for c in codes:
            self.t.XTestFakeKeyEvent(self.dpy, c, 1, 0)
        for c in reversed(codes):
            self.t.XTestFakeKeyEvent(self.dpy, c, 0, 0)
        self.sync()
        return True

    def close(self) -> None:
        if self.dpy:
            self.x.XCloseDisplay(self.dpy)
            self.dpy = None
