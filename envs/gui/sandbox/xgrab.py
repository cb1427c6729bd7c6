"""Screen grabs of the sandbox's X display with the standard library only (ctypes).

MIT-SHM (XShmGetImage) where the server offers it: the server writes the frame straight
into a shared segment, no copy through the socket; plain XGetImage otherwise. Frames come
back as raw BGRX bytes (4 per pixel, as Xvfb's 24-bit visual lays them out); the env
turns them into an RGB array.
"""

from __future__ import annotations

import ctypes
import ctypes.util

ZPIXMAP = 2
ALL_PLANES = 0xFFFFFFFF
IPC_PRIVATE, IPC_CREAT, IPC_RMID = 0, 0o1000, 0


class XImage(ctypes.Structure):
    _fields_ = [("width", ctypes.c_int), ("height", ctypes.c_int), ("xoffset", ctypes.c_int),
                ("format", ctypes.c_int), ("data", ctypes.c_void_p), ("byte_order", ctypes.c_int),
                ("bitmap_unit", ctypes.c_int), ("bitmap_bit_order", ctypes.c_int), ("bitmap_pad", ctypes.c_int),
                ("depth", ctypes.c_int), ("bytes_per_line", ctypes.c_int), ("bits_per_pixel", ctypes.c_int)]


class ShmSegmentInfo(ctypes.Structure):
    _fields_ = [("shmseg", ctypes.c_ulong), ("shmid", ctypes.c_int), ("shmaddr", ctypes.c_void_p),
                ("readOnly", ctypes.c_int)]


def _lib(name: str, soname: str) -> ctypes.CDLL:
    path = ctypes.util.find_library(name) or soname
    return ctypes.CDLL(path)


class Grabber:
    """One connection to `display`; `grab()` returns (width, height, BGRX bytes)."""

    def __init__(self, display: str):
        self.x = _lib("X11", "libX11.so.6")
        x = self.x
        x.XOpenDisplay.restype = ctypes.c_void_p
        x.XOpenDisplay.argtypes = [ctypes.c_char_p]
        x.XDefaultRootWindow.restype = ctypes.c_ulong
        x.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        x.XGetImage.restype = ctypes.POINTER(XImage)
        x.XGetImage.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                ctypes.c_uint, ctypes.c_ulong, ctypes.c_int]
        x.XDestroyImage = None  # a macro in Xlib; images are freed through XFree + their data
        x.XFree.argtypes = [ctypes.c_void_p]
        x.XDisplayWidth.argtypes = x.XDisplayHeight.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x.XDefaultScreen.argtypes = [ctypes.c_void_p]
        x.XSync.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x.XCloseDisplay.argtypes = [ctypes.c_void_p]
        self.dpy = x.XOpenDisplay(display.encode())
        if not self.dpy:
            raise OSError(f"cannot open X display {display}")
        screen = x.XDefaultScreen(self.dpy)
        self.width, self.height = x.XDisplayWidth(self.dpy, screen), x.XDisplayHeight(self.dpy, screen)
        self.root = x.XDefaultRootWindow(self.dpy)
        self.shm = self._setup_shm()

    def _setup_shm(self):
        try:
            xext = _lib("Xext", "libXext.so.6")
            libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
        xext.XShmQueryExtension.argtypes = [ctypes.c_void_p]
        if not xext.XShmQueryExtension(self.dpy):
            return None
        x = self.x
        x.XDefaultVisual.restype = ctypes.c_void_p
        x.XDefaultVisual.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x.XDefaultDepth.argtypes = [ctypes.c_void_p, ctypes.c_int]
        xext.XShmCreateImage.restype = ctypes.POINTER(XImage)
        xext.XShmCreateImage.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                                         ctypes.c_char_p, ctypes.POINTER(ShmSegmentInfo), ctypes.c_uint, ctypes.c_uint]
        xext.XShmAttach.argtypes = [ctypes.c_void_p, ctypes.POINTER(ShmSegmentInfo)]
        xext.XShmGetImage.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.POINTER(XImage), ctypes.c_int,
                                      ctypes.c_int, ctypes.c_ulong]
        libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        screen = x.XDefaultScreen(self.dpy)
        info = ShmSegmentInfo()
        image = xext.XShmCreateImage(self.dpy, x.XDefaultVisual(self.dpy, screen), x.XDefaultDepth(self.dpy, screen),
                                     ZPIXMAP, None, ctypes.byref(info), self.width, self.height)
        if not image:
            return None
        size = image.contents.bytes_per_line * self.height
        info.shmid = libc.shmget(IPC_PRIVATE, size, IPC_CREAT | 0o600)
        if info.shmid < 0:
            return None
        info.shmaddr = libc.shmat(info.shmid, None, 0)
        if info.shmaddr in (None, ctypes.c_void_p(-1).value):
            return None
        image.contents.data = info.shmaddr
        info.readOnly = 0
        ok = xext.XShmAttach(self.dpy, ctypes.byref(info))
        x.XSync(self.dpy, 0)
        libc.shmctl(info.shmid, IPC_RMID, None)  # freed once both sides detach (or die)
        if not ok:
            return None
        self.xext, self._info, self._size = xext, info, size
        return image

    @property
    def method(self) -> str:
        return "xshm" if self.shm else "xgetimage"

    def grab(self) -> tuple[int, int, bytes]:
        if self.shm:
            if not self.xext.XShmGetImage(self.dpy, self.root, self.shm, 0, 0, ALL_PLANES):
                raise OSError("XShmGetImage failed")
            img = self.shm.contents
            return self.width, self.height, ctypes.string_at(img.data, self._size)
        image = self.x.XGetImage(self.dpy, self.root, 0, 0, self.width, self.height, ALL_PLANES, ZPIXMAP)
        if not image:
            raise OSError("XGetImage failed")
        try:
            img = image.contents
            return self.width, self.height, ctypes.string_at(img.data, img.bytes_per_line * self.height)
        finally:
            data = image.contents.data
            self.x.XFree(ctypes.c_void_p(data))
            self.x.XFree(image)

    def grab_into(self, dest: int) -> int:
        """Grab the screen straight into memory at address `dest` (the frame buffer the host
        maps); return the byte count. One copy out of the XShm segment, no bytes object."""
        if self.shm:
            if not self.xext.XShmGetImage(self.dpy, self.root, self.shm, 0, 0, ALL_PLANES):
                raise OSError("XShmGetImage failed")
            ctypes.memmove(dest, self.shm.contents.data, self._size)
            return self._size
        _, _, frame = self.grab()
        ctypes.memmove(dest, frame, len(frame))
        return len(frame)

    @property
    def frame_bytes(self) -> int:
        return self._size if self.shm else self.width * self.height * 4

    def close(self) -> None:
        if self.dpy:
            self.x.XCloseDisplay(self.dpy)
            self.dpy = None
