"""User idle time for the probes: trust only sources that see the user's input in the
session type at hand; otherwise the reading is unknown, with the reason (OPS-FACTS 1.4).

Part of the probes (with `worker.probes`, the only code that reads the host). What sees
a user's input, by logind session type:

- text sessions (`Type=tty`: a console, ssh): the terminal's atime, which logind reports
  as `IdleSinceHint` for them, and which the scan of /dev/tty*, /dev/pts/* sees too;
- X11: the X server's XScreenSaver idle time for the session's display (`worker.xidle`,
  run as a child: an X error cannot take the worker down); the worker needs the right to
  open that display (the desktop user's own worker has it; a system user has not);
- Wayland (and Mir): only the compositor knows; GNOME's Mutter IdleMonitor is asked on
  the session owner's bus (reachable by that user only);
- any graphical session whose own source cannot be asked (a system worker): logind's
  `IdleHint`, which GNOME and KDE set when the session goes idle. `IdleHint=yes` is idle
  since `IdleSinceHint`; anything else is active (idle 0 s), so a desktop that never sets
  the hint keeps idle-gated work from starting.

Input in a graphical session touches no tty, and logind's `IdleSinceHint` there, while
`IdleHint` is no, is when the desktop last changed the hint (it may be hours old while the
user types), so neither is read as idleness for one. Each local graphical session must be
answered for: one that is not makes the whole reading unknown, and idle-gated work does
not start (coordd's `idle_unknown = "deny"`). Without logind, X11 sockets in
/tmp/.X11-unix and Wayland sockets in /run/user/* stand for the graphical sessions, and a
worker whose own environment names a graphical session (`XDG_SESSION_TYPE`,
`WAYLAND_DISPLAY`, `DISPLAY`) that no source answered for reads unknown: the terminals'
atimes are no evidence of that user's idleness.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordd.clock import SystemClock

Clock = Callable[[], float]
Run = Callable[..., subprocess.CompletedProcess[str]]
_SYSTEM_CLOCK = SystemClock()

SUBPROCESS_TIMEOUT_S_DEFAULT = 1.0
"""Bound on each helper call (loginctl, gdbus, the X11 query), seconds."""
LOGIND_MAX_SESSIONS = 64
"""Sessions asked about in one loginctl call; past this the reading is unknown."""
TTY_SKIP_PREFIXES = ("ttyS", "ttyACM")
"""Serial devices are not user input (BOINC client/hostinfo_unix.cpp)."""
GRAPHICAL_TYPES = ("x11", "wayland", "mir")
SESSION_PROPS = ("Id", "Type", "Class", "Remote", "State", "User", "Display", "IdleHint",
                 "IdleSinceHint")
GRAPHICAL_ENV = ("XDG_SESSION_TYPE", "WAYLAND_DISPLAY", "DISPLAY")
"""Variables of the worker's own environment that name a graphical session."""
GNOME_IDLE_CALL = ("gdbus", "call", "--session", "--dest", "org.gnome.Mutter.IdleMonitor",
                   "--object-path", "/org/gnome/Mutter/IdleMonitor/Core",
                   "--method", "org.gnome.Mutter.IdleMonitor.GetIdletime")


class SourceUnknown(Exception):
    """An idle-time source gave no answer; the message says why."""


IdleSource = Callable[[], float]
"""Return seconds since the last user input, or raise ``SourceUnknown``."""


@dataclass(frozen=True)
class Session:
    """One login session as logind describes it (or a display found without logind)."""

    id: str
    type: str = "tty"            # tty | x11 | wayland | mir | unspecified
    klass: str = "user"          # user | greeter | lock-screen | background | manager
    remote: bool = False
    state: str = "active"        # online | active | closing
    uid: int | None = None
    display: str = ""            # X11 display, e.g. ":0"
    idle_since_us: int = 0       # logind IdleSinceHint, CLOCK_REALTIME microseconds
    idle_hint: bool | None = None  # logind IdleHint (yes/no); None: logind not asked

    @property
    def graphical(self) -> bool:
        return self.type in GRAPHICAL_TYPES

    def label(self) -> str:
        owner = f", uid {self.uid}" if self.uid is not None else ""
        return f"{self.type} session {self.id}{owner}"


def _run(run: Run, argv: Sequence[str], timeout_s: float, env: dict[str, str] | None = None,
         what: str | None = None) -> str:
    what = what or argv[0]
    try:
        done = run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False,
                   env=env)
    except FileNotFoundError as exc:
        raise SourceUnknown(f"{what} not installed") from exc
    except (OSError, subprocess.SubprocessError) as exc:
        raise SourceUnknown(f"{what} raised {type(exc).__name__}: {exc}") from exc
    if done.returncode != 0:
        lines = (done.stderr or "").strip().splitlines()
        raise SourceUnknown(f"{what} failed: {lines[-1] if lines else f'exit {done.returncode}'}")
    return done.stdout


def logind_sessions(run: Run = subprocess.run,
                    timeout_s: float = SUBPROCESS_TIMEOUT_S_DEFAULT) -> Callable[[], list[Session]]:
    """Build a lister of logind's sessions (two ``loginctl`` calls at most).

    Raises (from the lister): SourceUnknown: loginctl is missing or fails (no systemd as
    PID 1, no bus), or there are more than LOGIND_MAX_SESSIONS sessions.
    """

    def sessions() -> list[Session]:
        ids = [ln.split()[0] for ln in
               _run(run, ("loginctl", "list-sessions", "--no-legend"), timeout_s).splitlines()
               if ln.strip()]
        if not ids:
            return []
        if len(ids) > LOGIND_MAX_SESSIONS:
            raise SourceUnknown(f"{len(ids)} login sessions, more than the "
                                f"{LOGIND_MAX_SESSIONS} checked")
        argv = ["loginctl", "show-session", *ids]
        for prop in SESSION_PROPS:
            argv += ["-p", prop]
        out, found = _run(run, argv, timeout_s), []
        for block in re.split(r"\n\s*\n", out.strip()):
            props = dict(ln.partition("=")[::2] for ln in block.splitlines() if "=" in ln)
            if props.get("Id"):
                found.append(_session(props))
        return found

    return sessions


def _session(props: dict[str, str]) -> Session:
    def num(key: str) -> int:
        try:
            return int(props.get(key, "").strip())
        except ValueError:
            return 0

    uid = num("User") if props.get("User", "").strip().isdigit() else None
    return Session(id=props["Id"], type=props.get("Type", "") or "unspecified",
                   klass=props.get("Class", ""), remote=props.get("Remote") == "yes",
                   state=props.get("State", ""), uid=uid, display=props.get("Display", ""),
                   idle_since_us=num("IdleSinceHint"),
                   idle_hint=props["IdleHint"].strip() == "yes" if "IdleHint" in props else None)


def display_sessions(x11_dir: str = "/tmp/.X11-unix",
                     run_user: str = "/run/user") -> Callable[[], list[Session]]:
    """Build a lister of graphical displays found without logind: X11 sockets `X<n>` and
    Wayland sockets `/run/user/<uid>/wayland-*`."""

    def sessions() -> list[Session]:
        found = [Session(id=f"X{n}", type="x11", display=f":{n}")
                 for n in _listdir(x11_dir, r"X(\d+)")]
        for uid in _listdir(run_user, r"(\d+)"):
            if _listdir(os.path.join(run_user, uid), r"wayland-\d+"):
                found.append(Session(id=f"wayland-{uid}", type="wayland", uid=int(uid)))
        return found

    return sessions


def _listdir(path: str, pattern: str) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    return [m.group(m.re.groups and 1 or 0) for n in names if (m := re.fullmatch(pattern, n))]


def x11_idle(run: Run = subprocess.run,
             timeout_s: float = SUBPROCESS_TIMEOUT_S_DEFAULT) -> Callable[[Session], float]:
    """Build an X11 source: XScreenSaver's idle time of the session's display, in a child
    (`python -m worker.xidle DISPLAY`)."""

    def idle(session: Session) -> float:
        if not session.display:
            raise SourceUnknown("logind names no X display for it")
        out = _run(run, (sys.executable, "-m", "worker.xidle", session.display), timeout_s,
                   what=f"XScreenSaver query of {session.display}")
        try:
            return max(0.0, int(out.strip()) / 1000.0)
        except ValueError:
            raise SourceUnknown(f"XScreenSaver query of {session.display} printed "
                                f"{out.strip()[:60]!r}") from None

    return idle


def gnome_idle(run: Run = subprocess.run, timeout_s: float = SUBPROCESS_TIMEOUT_S_DEFAULT,
               run_user: str = "/run/user") -> Callable[[Session], float]:
    """Build a Wayland source: GNOME Mutter's IdleMonitor on the session owner's bus."""

    def idle(session: Session) -> float:
        if session.uid is None:
            raise SourceUnknown("no owner uid to find its session bus")
        bus = os.path.join(run_user, str(session.uid), "bus")
        env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": f"unix:path={bus}"}
        out = _run(run, GNOME_IDLE_CALL, timeout_s, env=env,
                   what=f"GNOME IdleMonitor on {bus}")
        m = re.search(r"uint64 (\d+)", out)
        if m is None:
            raise SourceUnknown(f"GNOME IdleMonitor on {bus} answered {out.strip()[:60]!r}")
        return int(m.group(1)) / 1000.0

    return idle


def _tty_paths(dev: str) -> Iterable[str]:
    for name in _listdir(dev, r"(?:tty|pty).*"):
        if not name.startswith(TTY_SKIP_PREFIXES):
            yield os.path.join(dev, name)
    for name in _listdir(os.path.join(dev, "pts"), r"\d+"):  # not ptmx, the multiplexer
        yield os.path.join(dev, "pts", name)


def tty_idle_source(wall: Clock = _SYSTEM_CLOCK.wall, dev: str = "/dev") -> IdleSource:
    """Build a source from the newest atime of ``/dev/tty*``, ``/dev/pty*`` and ``/dev/pts/*``:
    text sessions' input. The kernel updates a tty's atime only every 8 s (OPS-FACTS 1.4).
    """

    def source() -> float:
        newest = 0.0
        for path in _tty_paths(dev):
            try:
                newest = max(newest, os.stat(path).st_atime)
            except OSError:
                continue
        if newest <= 0:
            raise SourceUnknown(f"no tty/pty device with an atime under {dev}")
        return max(0.0, wall() - newest)

    return source


GraphicalSource = Callable[[Session], float]


def logind_idle(session: Session, wall: Clock) -> float:
    """A graphical session's idle time by logind's hint: `IdleHint=yes` is idle since
    `IdleSinceHint`; anything else is active (0 s).

    Raises:
        SourceUnknown: the session did not come from logind (no hint was read).
    """
    if session.idle_hint is None:
        raise SourceUnknown("logind was not asked about it")
    if not session.idle_hint or session.idle_since_us <= 0:
        return 0.0
    return max(0.0, wall() - session.idle_since_us / 1e6)


def graphical_env(env: Mapping[str, str]) -> str | None:
    """The variables in `env` that name a graphical session (`NAME=value`, joined), or None."""
    named = [f"{k}={env[k]}" for k in GRAPHICAL_ENV
             if env.get(k) and (k != "XDG_SESSION_TYPE" or env[k] in GRAPHICAL_TYPES)]
    return ", ".join(named) or None


def session_idle_source(
    *,
    sessions: Callable[[], list[Session]] | None = None,
    displays: Callable[[], list[Session]] | None = None,
    tty: IdleSource | None = None,
    graphical: dict[str, GraphicalSource] | None = None,
    wall: Clock = _SYSTEM_CLOCK.wall,
    env: Mapping[str, str] | None = None,
) -> IdleSource:
    """Build the user-idle source: the least idle time over every session, each measured
    by a source that sees its input (see the module doc).

    Args:
        sessions: logind's sessions (default `logind_sessions()`); raising SourceUnknown
            means no logind, and `displays` stands for the graphical sessions.
        displays: graphical displays found without logind (default `display_sessions()`).
        tty: the tty/pty atime scan (default `tty_idle_source(wall)`).
        graphical: session type -> source (default x11: `x11_idle()`, wayland and mir:
            `gnome_idle()`); where it cannot answer, logind's `IdleHint` does
            (`logind_idle`), for the sessions logind described.
        wall: wall clock, epoch seconds (logind's hints are CLOCK_REALTIME).
        env: the worker's environment (default `os.environ`), read when logind cannot
            be asked: one that names a graphical session needs a graphical answer.

    Returns:
        A source; it raises SourceUnknown naming each local graphical session that no
        trusted source answered for (the worker's own, named by `env`, among them when
        logind cannot be asked), or when nothing answered at all.
    """
    env = os.environ if env is None else env
    sessions = sessions or logind_sessions()
    displays = displays or display_sessions()
    tty = tty or tty_idle_source(wall)
    if graphical is None:
        gnome = gnome_idle()
        graphical = {"x11": x11_idle(), "wayland": gnome, "mir": gnome}

    def source() -> float:
        answers: list[float] = []
        blind: list[str] = []   # graphical sessions nothing trusted answered for
        notes: list[str] = []
        seen_graphical = no_logind = False
        try:
            found = sessions()
        except SourceUnknown as exc:
            notes.append(f"logind: {exc}")
            found, no_logind = displays(), True
        for s in found:
            if s.klass not in ("user", "") or s.state == "closing":
                continue  # a greeter, a lingering manager, a session being torn down
            if s.graphical:
                ask = graphical.get(s.type)
                try:
                    if ask is None:
                        raise SourceUnknown("no idle source for this session type")
                    answers.append(ask(s))
                    seen_graphical = True
                except SourceUnknown as exc:
                    try:
                        answers.append(logind_idle(s, wall))
                        seen_graphical = True
                    except SourceUnknown as hint:
                        blind.append(f"{s.label()}: {exc}; {hint}")
            elif s.type == "tty" and s.idle_since_us > 0:
                answers.append(max(0.0, wall() - s.idle_since_us / 1e6))  # its tty's atime
        named = graphical_env(env) if no_logind and not seen_graphical else None
        if named is not None:
            blind.append(f"the worker's environment names a graphical session ({named}) and "
                         "logind cannot be asked; terminal atimes do not see its input")
        try:
            answers.append(tty())
        except SourceUnknown as exc:
            notes.append(f"tty: {exc}")
        if blind:
            raise SourceUnknown("no trusted idle source sees the input of "
                                + "; ".join(blind))
        if not answers:
            raise SourceUnknown("; ".join(notes) or "no session and no tty")
        return min(answers)

    return source
