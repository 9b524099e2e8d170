"""`python -m worker.xidle DISPLAY`: print the X server's idle time in milliseconds.

The XScreenSaver extension's `idle` (time since the last keyboard or pointer input), read
through libX11 and libXss with ctypes. A child of the probes (worker.idle): Xlib exits
the process on a lost connection, which must not be the worker. Exit 0 with the number,
1 with one line on stderr when the display cannot be opened or has no extension, 2 on
usage.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


class _Info(ctypes.Structure):
    _fields_ = [("window", ctypes.c_ulong), ("state", ctypes.c_int), ("kind", ctypes.c_int),
                ("til_or_since", ctypes.c_ulong), ("idle", ctypes.c_ulong),
                ("event_mask", ctypes.c_ulong)]


def idle_ms(display: str) -> int:
    """Milliseconds since the last input on `display`. Raises: OSError (no libraries, the
    display cannot be opened, or the server lacks MIT-SCREEN-SAVER)."""
    names = {lib: ctypes.util.find_library(lib) for lib in ("X11", "Xss")}
    missing = [f"lib{k}" for k, v in names.items() if not v]
    if missing:
        raise OSError(f"{' and '.join(missing)} not installed")
    x11, xss = ctypes.CDLL(names["X11"]), ctypes.CDLL(names["Xss"])
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XDefaultRootWindow.restype = ctypes.c_ulong
    x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    x11.XFree.argtypes = [ctypes.c_void_p]
    xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(_Info)
    xss.XScreenSaverQueryInfo.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.POINTER(_Info)]
    dpy = x11.XOpenDisplay(display.encode())
    if not dpy:
        raise OSError(f"cannot open X display {display} (not running, or no access as this user)")
    try:
        info = xss.XScreenSaverAllocInfo()
        try:
            if not xss.XScreenSaverQueryInfo(dpy, x11.XDefaultRootWindow(dpy), info):
                raise OSError(f"X display {display} has no MIT-SCREEN-SAVER extension")
            return int(info.contents.idle)
        finally:
            x11.XFree(info)
    finally:
        x11.XCloseDisplay(dpy)


def main(argv: list[str]) -> int:
    """Entry point; see the module doc for the exit codes."""
    if len(argv) != 1:
        print("usage: python -m worker.xidle DISPLAY", file=sys.stderr)
        return 2
    try:
        print(idle_ms(argv[0]))
    except OSError as exc:
        print(f"xidle: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
