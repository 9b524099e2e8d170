"""Resource gates: pure predicates over a worker's last readings. No I/O.

A `GatePolicy` holds the limits for one priority; `evaluate` returns the refusal reason
codes (docs/concepts/gates.md): `memory_high`, `too_hot`, `on_battery`,
`user_active`. Unknown readings (null) follow the explicit `*_unknown` knobs; the defaults
are the decisions in shared/cases/CASES.md: unknown temperature is allowed, unknown power
counts as battery for P3 idle work and as mains for P0..P2, unknown user idle fails closed.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

MEMORY_HIGH = "memory_high"
TOO_HOT = "too_hot"
ON_BATTERY = "on_battery"
USER_ACTIVE = "user_active"
GPU_TOO_HOT = "gpu_too_hot"
HEARTBEAT_STALE = "heartbeat_stale"
NO_MATCHING_ROLE = "no_matching_role"
PAYLOAD_DECODE_ERROR = "payload_decode_error"
CHECKPOINT_DECODE_ERROR = "checkpoint_decode_error"
GATES_DECODE_ERROR = "gates_decode_error"


class GatePolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Limits for claims at one priority. None disables a limit.

    Attributes:
        max_memory_pct: refuse when `memory_used_pct` is above this (percent).
        max_temperature_c: refuse when `temperature_c` is above this (degrees C).
        require_mains: refuse when `on_battery` is true.
        min_battery_pct: on battery, refuse below this charge (percent); mains always passes.
        min_user_idle_s: refuse unless `user_idle_s` is at least this (seconds).
        temperature_unknown: "allow" or "deny" when `temperature_c` is null.
        power_unknown: "mains" or "battery": how to read `on_battery` null.
        idle_unknown: "allow" or "deny" when `user_idle_s` is null.
        memory_unknown: "allow" or "deny" when `memory_used_pct` is null.
        on_close: what a closed gate does to a *running* job (coordd.rules.governance):
            "suspend" (SIGSTOP), "vacate" (hand back with a checkpoint) or "continue".
        max_suspend_s: a job suspended this long (seconds) is vacated.
        resume_after_s: a suspended job resumes once its gates stayed open this long (s).
        temperature_hysteresis_c: a job suspended for heat resumes only this many degrees
            below the limit that closed the gate.
        critical_temperature_c: above this a running job of any priority is suspended,
            whatever `on_close` says; None disables it.
        max_gpu_temperature_c: refuse (and, with `on_close`, hold running jobs) when the
            hottest GPU's `gpu_temperature_c` is above this (degrees C); a machine without
            a GPU reading passes.
    """

    max_memory_pct: float | None = 85.0
    max_temperature_c: float | None = 90.0
    require_mains: bool = False
    min_battery_pct: float | None = None
    min_user_idle_s: float | None = None
    temperature_unknown: Literal["allow", "deny"] = "allow"
    power_unknown: Literal["mains", "battery"] = "mains"
    idle_unknown: Literal["allow", "deny"] = "deny"
    memory_unknown: Literal["allow", "deny"] = "allow"
    on_close: Literal["suspend", "vacate", "continue"] = "continue"
    max_suspend_s: float = 600.0
    resume_after_s: float = 60.0
    temperature_hysteresis_c: float = 5.0
    critical_temperature_c: float | None = 95.0
    max_gpu_temperature_c: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_suspend_s", "resume_after_s", "temperature_hysteresis_c"):
            if not getattr(self, name) >= 0:  # refuses NaN too
                raise ValueError(f"{name} must be >= 0")


def default_policies() -> dict[int, GatePolicy]:
    """The built-in policy per priority: P0..P2 gate on memory and heat; P3 idle work also
    needs mains power, a user idle for 5 minutes and GPUs at most 83 C, and is suspended
    while a gate is closed (P0..P2 run on, unless above `critical_temperature_c`)."""
    base = GatePolicy()
    idle = GatePolicy(
        max_temperature_c=80.0, require_mains=True, min_user_idle_s=300.0,
        power_unknown="battery", on_close="suspend", max_gpu_temperature_c=83.0,
    )
    return {0: base, 1: base, 2: base, 3: idle}


def merge(policy: GatePolicy, overrides: dict[str, Any] | None) -> GatePolicy:
    """Return `policy` with a job's own gate overrides applied.

    Raises:
        msgspec.ValidationError: an override key or value is not a GatePolicy field.
    """
    if not overrides:
        return policy
    fields = msgspec.structs.asdict(policy)
    fields.update(overrides)
    return msgspec.convert(fields, GatePolicy)


def evaluate(policy: GatePolicy, readings: dict[str, Any]) -> list[tuple[str, str]]:
    """Return the refusals `[(reason_code, detail), ...]` for `readings`; [] means pass.

    `readings` is the stored heartbeat map; missing keys count as null. Never raises on
    odd values: a reading of the wrong type counts as unknown.
    """
    out: list[tuple[str, str]] = []
    mem = _num(readings.get("memory_used_pct"))
    if policy.max_memory_pct is not None:
        if mem is None:
            if policy.memory_unknown == "deny":
                out.append((MEMORY_HIGH, "memory: unavailable (policy denies)"))
        elif mem > policy.max_memory_pct:
            out.append((MEMORY_HIGH, f"memory {mem:g}% > {policy.max_memory_pct:g}%"))
    temp = _num(readings.get("temperature_c"))
    if policy.max_temperature_c is not None:
        if temp is None:
            if policy.temperature_unknown == "deny":
                why = readings.get("temperature_reason") or "no reading"
                out.append((TOO_HOT, f"temperature: unavailable ({why}); policy denies"))
        elif temp > policy.max_temperature_c:
            out.append((TOO_HOT, f"temperature {temp:g} > {policy.max_temperature_c:g}"))
    gpu_temp = _num(readings.get("gpu_temperature_c"))
    if policy.max_gpu_temperature_c is not None and gpu_temp is not None \
            and gpu_temp > policy.max_gpu_temperature_c:
        out.append((GPU_TOO_HOT, f"gpu temperature {gpu_temp:g} > "
                                 f"{policy.max_gpu_temperature_c:g}"))
    on_battery = readings.get("on_battery")
    if not isinstance(on_battery, bool):
        on_battery = None
    if on_battery is None:
        on_battery = policy.power_unknown == "battery"
        power = "unknown (counted as battery)" if on_battery else "unknown (counted as mains)"
    else:
        power = "battery" if on_battery else "mains"
    if on_battery and policy.require_mains:
        out.append((ON_BATTERY, f"power: {power}; mains required"))
    elif on_battery and policy.min_battery_pct is not None:
        pct = _num(readings.get("battery_pct"))
        if pct is None or pct < policy.min_battery_pct:
            shown = "unknown" if pct is None else f"{pct:g}%"
            out.append((ON_BATTERY, f"battery {shown} < {policy.min_battery_pct:g}%"))
    if policy.min_user_idle_s is not None:
        idle = _num(readings.get("user_idle_s"))
        if idle is None:
            if policy.idle_unknown == "deny":
                why = readings.get("user_idle_reason") or "no reading"
                out.append((USER_ACTIVE, f"user idle: unknown ({why}); policy denies"))
        elif idle < policy.min_user_idle_s:
            out.append((USER_ACTIVE, f"user idle {idle:g}s < {policy.min_user_idle_s:g}s"))
    return out


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value:  # NaN
        return None
    return float(value)
