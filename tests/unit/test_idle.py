"""User idle on graphical sessions (issue 14, bug 10): only sources that see the input of
the session type at hand count; a graphical session nobody can answer for makes the
reading unknown, with its reason, and idle-gated work does not start. Fake sources only
(the host boundary): loginctl, gdbus and the X11 query are faked `subprocess.run`s."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from coordd.rules import gates
from coordd.config import Config
from worker.idle import (
    Session, SourceUnknown, display_sessions, gnome_idle, logind_sessions, session_idle_source,
    x11_idle,
)
from worker.probes import Probes

WALL = 10_000.0


def unknown(why: str):
    def source(*_: object) -> float:
        raise SourceUnknown(why)
    return source


def fixed(value: float):
    return lambda *_: value


def idle(found, *, tty=None, graphical=None, displays=None, env=None) -> float:
    def sessions() -> list[Session]:
        if isinstance(found, Exception):
            raise found
        return found
    return session_idle_source(sessions=sessions, displays=displays or (lambda: []),
                               tty=tty or fixed(7200.0), graphical=graphical or {},
                               wall=lambda: WALL, env=env or {})()


def test_wayland_user_typing_is_not_idle_because_the_ttys_are_quiet():
    """The bug: tty atime (hours old) and logind's desktop-set hint said idle while the
    Wayland user typed; now the session needs a source that sees its input."""
    typing = Session("2", type="wayland", uid=1000,
                     idle_since_us=int((WALL - 5400) * 1e6))  # the hint: 90 min old
    with pytest.raises(SourceUnknown, match="wayland session 2, uid 1000: nope"):
        idle([typing], graphical={"wayland": unknown("nope")})
    assert idle([typing], graphical={"wayland": fixed(3.0)}) == 3.0


def test_logind_hint_of_a_graphical_session_is_read_only_when_its_source_cannot_answer():
    x = Session("c1", type="x11", display=":0", idle_hint=True,
                idle_since_us=int((WALL - 1) * 1e6))
    assert idle([x], graphical={"x11": fixed(900.0)}) == 900.0
    assert idle([x], graphical={"x11": unknown("no access to :0")}) == 1.0


LOGIND_WAYLAND = ("Id=2\nType=wayland\nClass=user\nRemote=no\nState=active\nUser=1000\n"
                  "Display=\nIdleHint={hint}\nIdleSinceHint={since}\n")


def system_worker_on_wayland(hint: str, since_s_ago: float, tty_idle: float = 7200.0) -> float:
    """The system worker's reading on a GNOME/KDE Wayland desktop, through fakes of the
    host's answers: loginctl's, and gdbus refused (the user's bus is not ours)."""
    def run(argv, **kw):
        if argv[0] == "gdbus":
            return subprocess.CompletedProcess(argv, 1, "", "Error: Could not connect: "
                                                            "Permission denied\n")
        if argv[1] == "list-sessions":
            return subprocess.CompletedProcess(argv, 0, "  2 1000 alice seat0 tty2\n", "")
        out = LOGIND_WAYLAND.format(hint=hint, since=int((WALL - since_s_ago) * 1e6))
        return subprocess.CompletedProcess(argv, 0, out, "")

    return session_idle_source(sessions=logind_sessions(run=run), displays=lambda: [],
                               tty=fixed(tty_idle), graphical={"wayland": gnome_idle(run=run)},
                               wall=lambda: WALL, env={})()


def test_system_worker_on_wayland_reads_loginds_idle_hint():
    """Issue 31 item 10: the GNOME IdleMonitor is on the user's bus, which a system service
    cannot reach, so the reading was unknown and P3 never ran on a Wayland desktop."""
    assert system_worker_on_wayland("yes", since_s_ago=600) == 600.0
    readings = Probes(idle_sources=[("sessions", lambda: system_worker_on_wayland("yes", 600))],
                      sensors_battery=lambda: None, sensors_temperatures=lambda: {}).read()
    assert readings["user_idle_s"] == 600.0
    assert gates.evaluate(Config().policies()[3], readings) == []


def test_a_desktop_that_never_sets_the_idle_hint_is_active():
    """IdleHint=no is active whatever IdleSinceHint says (the desktop's last change, hours
    ago while the user types): P3 waits, the gate names the user's activity."""
    assert system_worker_on_wayland("no", since_s_ago=5400) == 0.0
    readings = Probes(idle_sources=[("sessions", lambda: system_worker_on_wayland("no", 5400))],
                      sensors_battery=lambda: None, sensors_temperatures=lambda: {}).read()
    assert [c for c, _ in gates.evaluate(Config().policies()[3], readings)] == [gates.USER_ACTIVE]
    assert system_worker_on_wayland("", since_s_ago=5400) == 0.0  # anything else: active


@pytest.mark.parametrize("env", [{"XDG_SESSION_TYPE": "wayland"},
                                 {"WAYLAND_DISPLAY": "wayland-0"}, {"DISPLAY": ":0"}])
def test_without_logind_a_graphical_environment_makes_tty_atimes_no_evidence(env):
    """Issue 31 item 10: logind cannot be asked, the worker runs in a graphical session:
    the quiet terminals said idle while the user typed in the desktop."""
    no_logind = SourceUnknown("loginctl not installed")
    with pytest.raises(SourceUnknown, match="environment names a graphical session"):
        idle(no_logind, env=env)
    x0 = [Session("X0", type="x11", display=":0")]  # a display that does answer
    assert idle(no_logind, env=env, displays=lambda: x0, graphical={"x11": fixed(30.0)}) == 30.0


def test_a_text_environment_without_logind_still_reads_the_ttys():
    no_logind = SourceUnknown("loginctl not installed")
    assert idle(no_logind, env={"XDG_SESSION_TYPE": "tty", "TERM": "xterm"}) == 7200.0
    assert idle([Session("5", type="tty", idle_since_us=int((WALL - 9) * 1e6))],
                env={"WAYLAND_DISPLAY": "wayland-0"}) == 9.0  # logind answered: its sessions


def test_text_sessions_use_their_tty_atime_hint():
    ssh = Session("5", type="tty", remote=True, idle_since_us=int((WALL - 42) * 1e6))
    assert idle([ssh]) == 42.0


def test_greeter_closing_and_background_sessions_are_not_the_user():
    others = [Session("g", type="x11", klass="greeter", display=":1"),
              Session("z", type="wayland", state="closing", uid=1000),
              Session("m", type="unspecified", klass="manager")]
    assert idle(others, graphical={"x11": unknown("x"), "wayland": unknown("w")}) == 7200.0


def test_least_idle_session_counts():
    found = [Session("1", type="x11", display=":0"),
             Session("2", type="tty", idle_since_us=int((WALL - 60) * 1e6))]
    assert idle(found, graphical={"x11": fixed(12.0)}) == 12.0
    assert idle(found, graphical={"x11": fixed(120.0)}) == 60.0


def test_without_logind_displays_stand_for_graphical_sessions(tmp_path: Path):
    (tmp_path / "x11").mkdir()
    (tmp_path / "x11" / "X0").touch()
    (tmp_path / "run" / "1000").mkdir(parents=True)
    (tmp_path / "run" / "1000" / "wayland-0").touch()
    (tmp_path / "run" / "1001").mkdir()  # no compositor there
    shown = display_sessions(str(tmp_path / "x11"), str(tmp_path / "run"))()
    assert [(s.type, s.display, s.uid) for s in shown] == [("x11", ":0", None),
                                                          ("wayland", "", 1000)]
    no_logind = SourceUnknown("loginctl not installed")
    with pytest.raises(SourceUnknown, match="wayland session wayland-1000"):
        idle(no_logind, displays=lambda: shown,
             graphical={"x11": fixed(5.0), "wayland": unknown("no GNOME")})
    assert idle(no_logind, displays=lambda: []) == 7200.0  # a headless box: the ttys


def test_nothing_answering_is_unknown_with_every_reason():
    with pytest.raises(SourceUnknown, match="logind: no bus; tty: no tty"):
        idle(SourceUnknown("no bus"), tty=unknown("no tty"))


def test_logind_sessions_parse_one_show_session_call():
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        if argv[1] == "list-sessions":
            return subprocess.CompletedProcess(argv, 0, "  2 1000 alice seat0 tty2\n"
                                                        "  7 1001 bob - pts/0\n", "")
        out = ("Id=2\nType=wayland\nClass=user\nRemote=no\nState=active\nUser=1000\n"
               "Display=\nIdleHint=yes\nIdleSinceHint=0\n\n"
               "Id=7\nType=tty\nClass=user\nRemote=yes\nState=active\nUser=1001\n"
               "Display=\nIdleSinceHint=9990000000\n")
        return subprocess.CompletedProcess(argv, 0, out, "")

    got = logind_sessions(run=run)()
    assert [c[1] for c in calls] == ["list-sessions", "show-session"]
    assert got == [Session("2", type="wayland", uid=1000, state="active", idle_hint=True),
                   Session("7", type="tty", remote=True, uid=1001, state="active",
                           idle_since_us=9_990_000_000)]


def test_logind_failure_and_timeout_are_unknown():
    def down(argv, **_):
        return subprocess.CompletedProcess(argv, 1, "", "Failed to connect to bus: Host is down\n")

    def slow(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    with pytest.raises(SourceUnknown, match="loginctl failed: Failed to connect to bus"):
        logind_sessions(run=down)()
    with pytest.raises(SourceUnknown, match="TimeoutExpired"):
        logind_sessions(run=slow)()


def test_x11_and_gnome_sources_parse_their_helpers():
    seen = {}

    def run(argv, **kw):
        seen[argv[0]] = kw.get("env")
        if argv[0] == "gdbus":
            return subprocess.CompletedProcess(argv, 0, "(uint64 4500,)\n", "")
        assert argv[1:] == ["-m", "worker.xidle", ":0"]
        return subprocess.CompletedProcess(argv, 0, "2500\n", "")

    assert x11_idle(run=run)(Session("1", type="x11", display=":0")) == 2.5
    assert gnome_idle(run=run, run_user="/r")(Session("2", type="wayland", uid=7)) == 4.5
    assert seen["gdbus"]["DBUS_SESSION_BUS_ADDRESS"] == "unix:path=/r/7/bus"
    with pytest.raises(SourceUnknown, match="no X display"):
        x11_idle(run=run)(Session("1", type="x11"))


def test_xidle_helper_refuses_a_display_it_cannot_open():
    """The real child: no X server at this display, one line, exit 1 (never a crash)."""
    with pytest.raises(SourceUnknown, match="XScreenSaver query of :97 failed: xidle: "):
        x11_idle()(Session("1", type="x11", display=":97"))


def test_unknown_idle_reading_keeps_p3_from_starting_with_the_reason():
    def blind() -> float:
        raise SourceUnknown("no trusted idle source sees the input of wayland session 2")

    readings = Probes(idle_sources=[("sessions", blind)], sensors_battery=lambda: None,
                      sensors_temperatures=lambda: {}).read()
    assert readings["user_idle_s"] is None
    assert "wayland session 2" in readings["user_idle_reason"]
    refusals = gates.evaluate(Config().policies()[3], readings)
    assert [code for code, _ in refusals] == [gates.USER_ACTIVE]
    assert "wayland session 2" in refusals[0][1]
