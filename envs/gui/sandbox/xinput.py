"""Mouse and key input through the XTEST extension, in-process (ctypes, standard library).

A click is a few X requests instead of a new xdotool process (tens of ms on a busy
host); text typing and keys XTEST cannot map without remapping the keyboard still go
through xdotool (the daemon decides).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

# Xlib's default error handler exits the process; a window that closed between reading
# _NET_ACTIVE_WINDOW and its title (BadWindow) must not end the daemon
_ERROR_HANDLER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(lambda dpy, event: 0)

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
        x.XInternAtom.restype = ctypes.c_ulong
        x.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        x.XDefaultRootWindow.restype = ctypes.c_ulong
        x.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        x.XGetWindowProperty.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_long, ctypes.c_long,
                                         ctypes.c_int, ctypes.c_ulong, ctypes.POINTER(ctypes.c_ulong),
                                         ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_ulong),
                                         ctypes.POINTER(ctypes.c_ulong), ctypes.POINTER(ctypes.c_void_p)]
        x.XFree.argtypes = [ctypes.c_void_p]
        x.XSetErrorHandler.argtypes = [ctypes.c_void_p]
        x.XSetErrorHandler(ctypes.cast(_ERROR_HANDLER, ctypes.c_void_p))
        self.dpy = x.XOpenDisplay(display.encode())
        if not self.dpy:
            raise OSError(f"cannot open X display {display}")
        self.root = x.XDefaultRootWindow(self.dpy)
        # no key autorepeat: a key is pressed and released by one action, and a typing process
        # that the host's load keeps from running between press and release (xdotool sleeps
        # --delay/2 in between) must not get the X server to repeat it ("eeeecho": seen)
        x.XAutoRepeatOff.argtypes = [ctypes.c_void_p]
        x.XAutoRepeatOff(self.dpy)
        self.sync()
        self.atoms = {n: x.XInternAtom(self.dpy, n.encode(), 0)
                      for n in ("_NET_ACTIVE_WINDOW", "_NET_WM_NAME", "WM_NAME", "UTF8_STRING")}

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

    def atom(self, name: str) -> int:
        if name not in self.atoms:
            self.atoms[name] = self.x.XInternAtom(self.dpy, name.encode(), 0)
        return self.atoms[name]

    def get_property(self, window: int, name: str, limit: int = 4096) -> tuple[int, bytes] | None:
        """(format, raw bytes) of a window property, or None (AnyPropertyType)."""
        kind, fmt = ctypes.c_ulong(), ctypes.c_int()
        count, after, data = ctypes.c_ulong(), ctypes.c_ulong(), ctypes.c_void_p()
        status = self.x.XGetWindowProperty(self.dpy, window, self.atom(name), 0, limit, 0, 0, ctypes.byref(kind),
                                           ctypes.byref(fmt), ctypes.byref(count), ctypes.byref(after),
                                           ctypes.byref(data))
        if status != 0 or not data.value:
            return None
        try:
            size = {8: 1, 16: ctypes.sizeof(ctypes.c_short), 32: ctypes.sizeof(ctypes.c_long)}.get(fmt.value, 1)
            return fmt.value, ctypes.string_at(data.value, count.value * size)
        finally:
            self.x.XFree(data)

    def window_manager_ready(self, timeout: float) -> bool:
        """Map a 1x1 probe window and wait until the window manager manages it (sets its
        WM_STATE), then destroy it. Proves the WM's event loop handles MapRequests: a program
        that maps its window before that loses the request (openbox drops the MapRequests that
        come while it starts) and its window never shows (st then never starts its shell)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the WM may not have claimed the screen yet: map again
            probe = self.map_window()
            try:
                until = min(deadline, time.monotonic() + 2.0)
                while time.monotonic() < until:
                    if self.get_property(probe, "WM_STATE", 2):
                        return True
                    time.sleep(0.02)
            finally:
                self.destroy_window(probe)
        return False

    def map_window(self) -> int:
        """A new 1x1 top-level window of ours, mapped (the window manager then manages it)."""
        x = self.x
        x.XCreateSimpleWindow.restype = ctypes.c_ulong
        x.XCreateSimpleWindow.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                          ctypes.c_uint, ctypes.c_uint, ctypes.c_ulong, ctypes.c_ulong]
        x.XMapWindow.argtypes = x.XDestroyWindow.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
        window = x.XCreateSimpleWindow(self.dpy, self.root, 0, 0, 1, 1, 0, 0, 0)
        x.XMapWindow(self.dpy, window)
        self.sync()
        return window

    def destroy_window(self, window: int) -> None:
        self.x.XDestroyWindow(self.dpy, window)
        self.sync()

    def active_window_title(self) -> str:
        """The title of the window the window manager calls active (as `xdotool getactivewindow
        getwindowname`, without a new process per step); '' when there is none."""
        active = self.get_property(self.root, "_NET_ACTIVE_WINDOW", 1)
        if not active or len(active[1]) < ctypes.sizeof(ctypes.c_long):
            return ""
        window = ctypes.c_ulong.from_buffer_copy(active[1][:ctypes.sizeof(ctypes.c_ulong)]).value
        if not window:
            return ""
        name = self.get_property(window, "_NET_WM_NAME") or self.get_property(window, "WM_NAME")
        return name[1].decode("utf-8", errors="replace") if name else ""

    def close(self) -> None:
        if self.dpy:
            self.x.XCloseDisplay(self.dpy)
            self.dpy = None
