"""Read the host's resource conditions for the heartbeat; with worker.idle (user idle time),
the only code that touches the host.

Every reading may be unknown. An unknown reading is ``None`` plus a human reason, never an
exception: the gate policy in coordd decides what unknown means (OPS-FACTS 1.2-1.4).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from coordd.clock import SystemClock
from worker.gpu import GPU_KEYS, GpuProbe, no_gpus
from worker.idle import IdleSource, SourceUnknown, session_idle_source, tty_idle_source
from worker.override import ReadingsOverride

__all__ = ["READING_KEYS", "IdleSource", "Probes", "ReasonLog", "SourceUnknown",
           "session_idle_source", "tty_idle_source"]

logger = logging.getLogger(__name__)

LOG_INTERVAL_S_DEFAULT = 600.0
"""At most one log line per distinct failure reason in this many seconds."""

READING_KEYS = (
    "memory_used_pct",
    "temperature_c",
    "temperature_reason",
    "on_battery",
    "power_reason",
    "battery_pct",
    "user_idle_s",
    "user_idle_reason",
    "ram_mb",
    *GPU_KEYS,
)

Clock = Callable[[], float]
_SYSTEM_CLOCK = SystemClock()

HOST_SENSORS_TEMPERATURES: Callable[[], dict[str, Any]] | None = getattr(psutil, "sensors_temperatures", None)
"""psutil's provider, or None where the platform lacks it (only Linux and FreeBSD have it)."""
HOST_SENSORS_BATTERY: Callable[[], Any] | None = getattr(psutil, "sensors_battery", None)


class ReasonLog:
    """Log a warning at most once per distinct reason per interval."""

    def __init__(self, mono: Clock = _SYSTEM_CLOCK.mono, interval_s: float = LOG_INTERVAL_S_DEFAULT) -> None:
        """Create the limiter.

        Args:
            mono: Monotonic clock, seconds.
            interval_s: Minimum seconds between two lines for the same reason.

        Raises:
            ValueError: If ``interval_s`` is negative.
        """
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self._mono = mono
        self._interval_s = interval_s
        self._last: dict[str, float] = {}

    def warn(self, action: str, reason: str) -> bool:
        """Log ``reason`` under ``action`` unless the same pair was logged recently; True if logged."""
        key = f"{action}:{reason}"
        now = self._mono()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            return False
        self._last[key] = now
        logger.warning("probe %s unavailable: %s", action, reason, extra={"action": action, "reason": reason})
        return True


def _describe(call: str, exc: BaseException) -> str:
    return f"{call} raised {type(exc).__name__}: {exc}"


class Probes:
    """Measure memory, temperature, power and user idle time through injectable providers."""

    def __init__(
        self,
        *,
        virtual_memory: Callable[[], Any] = psutil.virtual_memory,
        sensors_temperatures: Callable[[], dict[str, Any]] | None = HOST_SENSORS_TEMPERATURES,
        sensors_battery: Callable[[], Any] | None = HOST_SENSORS_BATTERY,
        idle_sources: Sequence[tuple[str, IdleSource]] | None = None,
        override_path: str | None = None,
        mono: Clock = _SYSTEM_CLOCK.mono,
        wall: Clock = _SYSTEM_CLOCK.wall,
        log_interval_s: float = LOG_INTERVAL_S_DEFAULT,
        gpu: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Create the probes; defaults read the host through psutil, loginctl and /dev.

        Args:
            virtual_memory: Returns an object with ``percent`` (0-100, based on ``available``).
            sensors_temperatures: psutil-style ``{chip: [entry.current °C, ...]}``; None where the
                platform lacks it.
            sensors_battery: psutil-style battery (``percent``, ``power_plugged``) or None; the
                provider itself is None where the platform lacks it.
            idle_sources: ``(name, source)`` pairs, each for the whole machine: the least
                answer counts, and the reading is unknown when none answers. Default: one,
                `worker.idle.session_idle_source` (each session by a source that sees its
                input; unknown while a graphical session has none).
            override_path: JSON file whose keys replace readings on every ``read()``
                (worker.override: a bad file keeps the last good one, no file ends it).
            mono: Monotonic clock, seconds (log rate limiting).
            wall: Wall clock, epoch seconds (idle computation).
            log_interval_s: Minimum seconds between two log lines for the same failure.
            gpu: Returns the GPU readings (`worker.gpu.GPU_KEYS`); default: a
                `worker.gpu.GpuProbe` over NVML.
        """
        self._virtual_memory = virtual_memory
        self._sensors_temperatures = sensors_temperatures
        self._sensors_battery = sensors_battery
        if idle_sources is None:
            idle_sources = (("sessions", session_idle_source(wall=wall)),)
        self._idle_sources = tuple(idle_sources)
        self._override = None if not override_path else ReadingsOverride(override_path,
                                                                         READING_KEYS)
        self._log = ReasonLog(mono, log_interval_s)
        self._gpu = gpu or GpuProbe().read

    def read(self) -> dict[str, Any]:
        """Return one reading of every key in ``READING_KEYS``; never raises.

        Blocking (it may run ``loginctl`` and an idle query per graphical session, bounded at
        1 s a call): call it from a thread in async code.
        """
        readings: dict[str, Any] = dict(zip(("memory_used_pct", "ram_mb"), self._memory()))
        readings["temperature_c"], readings["temperature_reason"] = self._temperature()
        readings["on_battery"], readings["battery_pct"], readings["power_reason"] = self._power()
        readings["user_idle_s"], readings["user_idle_reason"] = self._idle()
        readings.update(self._gpus())
        return readings if self._override is None else self._override.apply(readings)

    def _memory(self) -> tuple[float | None, float | None]:
        """(percent used, total MiB: the RAM jobs may ask for, coordd.rules.resources)."""
        try:
            vm = self._virtual_memory()
            pct = float(vm.percent)
        except Exception as exc:  # noqa: BLE001 - a provider must never crash the heartbeat
            self._log.warn("memory", _describe("virtual_memory", exc))
            return None, None
        total = getattr(vm, "total", None)
        ok = isinstance(total, int | float) and math.isfinite(total) and total > 0
        return pct, (round(total / (1 << 20)) if ok else None)

    def _gpus(self) -> dict[str, Any]:
        try:
            return self._gpu()
        except Exception as exc:  # noqa: BLE001 - an injected provider's bug, not a crash
            reason = _describe("gpu", exc)
            self._log.warn("gpu", reason)
            return no_gpus(reason)

    def _temperature(self) -> tuple[float | None, str | None]:
        if self._sensors_temperatures is None:
            return self._unknown("temperature", "not supported on this platform")
        try:
            chips = self._sensors_temperatures()
        except Exception as exc:  # noqa: BLE001
            return self._unknown("temperature", _describe("sensors_temperatures", exc))
        if not chips:
            return self._unknown("temperature", "no sensors")
        values: list[float] = []
        try:
            for entries in chips.values():
                for entry in entries:
                    current = getattr(entry, "current", None)
                    if isinstance(current, int | float) and math.isfinite(current):
                        values.append(float(current))
        except Exception as exc:  # noqa: BLE001 - a malformed provider result
            return self._unknown("temperature", _describe("reading sensors", exc))
        if not values:
            return self._unknown("temperature", "no readable sensor value")
        return max(values), None

    def _power(self) -> tuple[bool | None, float | None, str | None]:
        if self._sensors_battery is None:
            return False, None, "no battery (not supported on this platform)"
        try:
            battery = self._sensors_battery()
            if battery is None:
                return False, None, "no battery"  # a desktop or server counts as mains (OPS-FACTS 1.3)
            percent = battery.percent
            plugged = battery.power_plugged
        except Exception as exc:  # noqa: BLE001
            reason = _describe("sensors_battery", exc)
            self._log.warn("power", reason)
            return None, None, reason
        pct = float(percent) if isinstance(percent, int | float) and math.isfinite(percent) else None
        if plugged is None:
            return None, pct, "power state unknown"
        return (not plugged), pct, None

    def _idle(self) -> tuple[float | None, str | None]:
        answers: list[float] = []
        reasons: list[str] = []
        for name, source in self._idle_sources:
            try:
                answers.append(float(source()))
            except SourceUnknown as exc:
                reasons.append(f"{name}: {exc}")
            except Exception as exc:  # noqa: BLE001
                reasons.append(f"{name}: {_describe('source', exc)}")
        if answers:
            return min(answers), None
        reason = "no idle source answered" + (f" ({'; '.join(reasons)})" if reasons else "")
        return self._unknown("user_idle", reason)

    def _unknown(self, action: str, reason: str) -> tuple[None, str]:
        self._log.warn(action, reason)
        return None, reason
