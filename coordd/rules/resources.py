"""Resource admission: whether a worker has room for a job's `gpus`, `vram_mb`, `ram_mb`.

Pure: readings, requests and grants in, a grant or a refusal out. A worker's capacity is
what its heartbeat advertises (`gpu_devices`, `ram_mb`); what its held leases were granted
is subtracted, and each GPU's live reading (`memory_used_mb`) must show the VRAM free too.
`vram_mb` is per GPU; a job asking for GPUs without `vram_mb` takes them whole, and only
GPUs whose live reading shows them idle (WHOLE_GPU_USED_MAX_MB). A device's index is its
`index`, else its list position (`device_index`): one rule everywhere. The one rule: a
claim that finds no room says which resource and how much.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import msgspec

from coordd import errors

RESOURCES = "resources"  # the claim's refusal code
MAX = {"gpus": 64, "vram_mb": 1 << 24, "ram_mb": 1 << 24}  # 16 TiB: past it is a typo
"""The largest request per key (a count, MiB, MiB)."""
GPU_DEVICES_MAX = 64  # devices a heartbeat may list; indexes are 0..GPU_DEVICES_MAX-1
GPU_MEMORY_MAX_MB = 1 << 24  # a GPU's memory_total_mb past this (16 TiB) is not a reading
WHOLE_GPU_USED_MAX_MB = 1024
"""A whole-GPU grant needs the GPU's live `memory_used_mb` at most this (MiB): a driver or
display context, not another program's model."""


class Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What one job asks for (0 = nothing): GPUs, MiB of VRAM on each, MiB of RAM."""

    gpus: int = 0
    vram_mb: int = 0
    ram_mb: int = 0

    def __post_init__(self) -> None:
        for key, top in MAX.items():
            value = getattr(self, key)
            if not 0 <= value <= top:
                raise ValueError(f"{key} must be 0..{top}, got {value}")
        if self.vram_mb and not self.gpus:
            self.gpus = 1  # VRAM means a GPU

    @property
    def empty(self) -> bool:
        """True when it asks for nothing."""
        return not (self.gpus or self.ram_mb)


class Grant(msgspec.Struct, frozen=True):
    """What a lease holds: GPU indexes, MiB of VRAM on each (0: the GPUs whole), RAM MiB."""

    gpu_ids: tuple[int, ...] = ()
    vram_mb: int = 0
    ram_mb: int = 0


class Gpu(msgspec.Struct, frozen=True):
    """One advertised GPU (MiB); `used_mb` None where the worker cannot read it."""

    index: int
    total_mb: float
    used_mb: float | None


def parse_request(value: Any, where: str = "resources") -> Request | None:
    """Check a request as sent (a map of gpus, vram_mb, ram_mb); None when it asks nothing.

    Raises:
        errors.BadRequest: an unknown key, a value not an integer, negative or absurd;
            the message names the field (`resources.vram_mb must be 0..16777216, got -5`).
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise errors.BadRequest(f"{where} must be a map of gpus, vram_mb, ram_mb")
    for key, v in value.items():
        if key not in MAX:
            raise errors.BadRequest(f"{where}: unknown key {key!r} (known: gpus, vram_mb, "
                                    "ram_mb)")
        if isinstance(v, bool) or not isinstance(v, int):
            raise errors.BadRequest(f"{where}.{key} must be an integer, got {v!r}")
        if not 0 <= v <= MAX[key]:
            raise errors.BadRequest(f"{where}.{key} must be 0..{MAX[key]}, got {v}")
    req = Request(**value)
    return None if req.empty else req


def device_index(device: dict[str, Any], position: int) -> Any:
    """A device's index: its `index` key, else its position in `gpu_devices`."""
    return device.get("index", position)


def _devices(readings: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(index, device) for each well-formed entry of `gpu_devices`: an int index in range,
    the first of duplicates only (stored heartbeats predate `check_readings`)."""
    out: list[tuple[int, dict[str, Any]]] = []
    seen: set[int] = set()
    devices = readings.get("gpu_devices")
    for i, d in enumerate(devices if isinstance(devices, list) else ()):
        if not isinstance(d, dict):
            continue
        index = device_index(d, i)
        if (isinstance(index, bool) or not isinstance(index, int)
                or not 0 <= index < GPU_DEVICES_MAX or index in seen):
            continue
        seen.add(index)
        out.append((index, d))
    return out


def gpus_of(readings: dict[str, Any]) -> list[Gpu]:
    """The GPUs a heartbeat advertises (`gpu_devices`); odd entries are skipped."""
    out = []
    for index, d in _devices(readings):
        total, used = _num(d.get("memory_total_mb")), _num(d.get("memory_used_mb"))
        if total is None or total <= 0:
            continue
        out.append(Gpu(index=index, total_mb=total, used_mb=used))
    return out


def check_readings(readings: dict[str, Any]) -> None:
    """Refuse a heartbeat's GPU readings that admission cannot trust.

    `gpu_devices`: at most GPU_DEVICES_MAX maps, each index (its `index`, else its
    position) an integer 0..GPU_DEVICES_MAX-1 and unique, `memory_total_mb` a finite
    number in (0, GPU_MEMORY_MAX_MB], `memory_used_mb` null or 0..total,
    `gpu_temperature_c` / `utilization_pct` null or finite; `gpus`, when sent beside the
    list, equals its length.

    Raises:
        errors.BadRequest: the message names the field
            (`readings.gpu_devices[1].index: 0 is listed twice`).
    """
    devices = readings.get("gpu_devices")
    gpus = readings.get("gpus")
    if devices is None:
        if gpus:
            raise errors.BadRequest(f"readings.gpus: {gpus} but no gpu_devices list them")
        return
    if not isinstance(devices, list):
        raise errors.BadRequest("readings.gpu_devices must be a list")
    if len(devices) > GPU_DEVICES_MAX:
        raise errors.BadRequest(f"readings.gpu_devices: at most {GPU_DEVICES_MAX} devices, "
                                f"got {len(devices)}")
    if gpus is not None and gpus != len(devices):
        raise errors.BadRequest(f"readings.gpus: {gpus} but gpu_devices lists {len(devices)}")
    seen: set[int] = set()
    for i, d in enumerate(devices):
        where = f"readings.gpu_devices[{i}]"
        if not isinstance(d, dict):
            raise errors.BadRequest(f"{where} must be a map")
        index = device_index(d, i)
        if isinstance(index, bool) or not isinstance(index, int) \
                or not 0 <= index < GPU_DEVICES_MAX:
            raise errors.BadRequest(f"{where}.index must be an integer "
                                    f"0..{GPU_DEVICES_MAX - 1}, got {index!r}")
        if index in seen:
            raise errors.BadRequest(f"{where}.index: {index} is listed twice")
        seen.add(index)
        total = d.get("memory_total_mb")
        if not _finite(total) or not 0 < total <= GPU_MEMORY_MAX_MB:
            raise errors.BadRequest(f"{where}.memory_total_mb must be a finite number in "
                                    f"(0, {GPU_MEMORY_MAX_MB}], got "
                                    f"{d.get('memory_total_mb')!r}")
        used = d.get("memory_used_mb")
        if used is not None and not (_finite(used) and 0 <= used <= total):
            raise errors.BadRequest(f"{where}.memory_used_mb must be null or 0..{total:g}, "
                                    f"got {used!r}")
        for key in ("gpu_temperature_c", "utilization_pct"):
            value = d.get(key)
            if value is not None and not _finite(value):
                raise errors.BadRequest(f"{where}.{key} must be null or a finite number, "
                                        f"got {value!r}")


class Short(msgspec.Struct, frozen=True):
    """Why one worker has no room for a request: `line` says it for that worker alone (a
    claim's refusal); `resource`, `need`, `label`, `pieces` [(where on the worker or "",
    amount)] and `note` (said after the worker's name) let `shortfall` word several
    workers in one sentence."""

    line: str
    resource: str  # "ram" | "gpus" | "vram"
    need: str      # "8000 MiB", "2", "1 whole"
    label: str     # "free" | "has"
    pieces: tuple[tuple[str, str], ...]
    note: str = ""


def fit(readings: dict[str, Any], need: Request, held: Iterable[Grant]) -> Grant | str:
    """The grant for `need` on a worker with `readings` holding `held`, or why not (one
    line: `vram: need 8000 MiB, 3100 free on gpu1`). GPUs are chosen best fit: the ones
    with the least VRAM free that still fits, by index among equals."""
    got = check(readings, need, held)
    return got.line if isinstance(got, Short) else got


def check(readings: dict[str, Any], need: Request, held: Iterable[Grant]) -> Grant | Short:
    """`fit`, with a refusal as a Short (see there)."""
    held = list(held)
    if need.ram_mb:
        cap = _num(readings.get("ram_mb"))
        if cap is None:
            return Short(f"ram: need {need.ram_mb} MiB, the worker advertises no ram_mb",
                         "ram", f"{need.ram_mb} MiB", "free", (("", "none advertised"),))
        free = cap - sum(g.ram_mb for g in held)
        if free < need.ram_mb:
            return Short(f"ram: need {need.ram_mb} MiB, {max(0.0, free):.0f} free of {cap:.0f}",
                         "ram", f"{need.ram_mb} MiB", "free",
                         (("", f"{max(0.0, free):.0f} of {cap:.0f}"),))
    if not need.gpus:
        return Grant(ram_mb=need.ram_mb)
    gpus = gpus_of(readings)
    if len(gpus) < need.gpus:
        why = readings.get("gpu_reason")
        why = f" ({why})" if isinstance(why, str) and why else ""
        return Short(f"gpus: need {need.gpus}, the worker has {len(gpus)}{why}",
                     "gpus", f"{need.gpus}", "has", (("", f"{len(gpus)}"),), why)
    free = {g.index: _free(g, held) for g in gpus}
    if need.vram_mb:
        ok = sorted((f, i) for i, f in free.items() if f >= need.vram_mb)
    else:  # whole GPUs: nothing granted on them, and idle by the live reading
        unbooked = [g for g in gpus if not any(g.index in h.gpu_ids for h in held)]
        ok = sorted((0.0, g.index) for g in unbooked
                    if g.used_mb is None or g.used_mb <= WHOLE_GPU_USED_MAX_MB)
    if len(ok) < need.gpus:
        if not need.vram_mb:
            busy = [g for g in unbooked if (g.used_mb or 0) > WHOLE_GPU_USED_MAX_MB]
            said = "".join(f"; gpu{g.index} shows {g.used_mb:.0f} MiB in use (a whole GPU "
                           f"needs <= {WHOLE_GPU_USED_MAX_MB})" for g in busy[:2])
            return Short(f"gpus: need {need.gpus} whole, {len(ok)} of {len(gpus)} free{said}",
                         "gpus", f"{need.gpus} whole", "free",
                         (("", f"{len(ok)} of {len(gpus)}"),), "".join(
                             f" (gpu{g.index} shows {g.used_mb:.0f} MiB in use)"
                             for g in busy[:1]))
        best = max(free, key=lambda i: (free[i], -i))
        more = f" ({len(ok)} of {len(gpus)} GPUs fit, need {need.gpus})" if len(gpus) > 1 else ""
        each = f" on each of {need.gpus} GPUs" if need.gpus > 1 else ""
        return Short(f"vram: need {need.vram_mb} MiB, {max(0.0, free[best]):.0f} free on "
                     f"gpu{best}{more}", "vram", f"{need.vram_mb} MiB{each}", "free",
                     tuple((f"gpu{i}", f"{max(0.0, f):.0f}")
                           for i, f in sorted(free.items(), key=lambda x: (-x[1], x[0]))))
    ids = tuple(sorted({i for _, i in ok[:need.gpus]}))
    if len(ids) != need.gpus:  # gpus_of lists each index once; never grant one twice
        line = f"gpus: need {need.gpus}, the worker lists {len(ids)} distinct"
        return Short(line, "gpus", f"{need.gpus}", "has", (("", f"{len(ids)} distinct"),))
    return Grant(gpu_ids=ids, vram_mb=need.vram_mb, ram_mb=need.ram_mb)


def fits_without(readings: dict[str, Any], need: Request, held: list[Grant],
                 freed: Grant | None) -> bool:
    """Whether `need` fits once the run holding `freed` is gone: its grant off the books
    and its VRAM off the live reading (for preemption's victim choice)."""
    if freed is not None and freed.gpu_ids:
        devices = []
        for index, d in _devices(readings):
            d = {**d, "index": index}
            if index in freed.gpu_ids:
                used, total = _num(d.get("memory_used_mb")), _num(d.get("memory_total_mb"))
                if used is not None and total is not None:
                    d["memory_used_mb"] = max(0.0, used - (freed.vram_mb or total))
            devices.append(d)
        readings = {**readings, "gpu_devices": devices}
    rest = [g for g in held if g is not freed]
    return not isinstance(fit(readings, need, rest), str)


def hold_back(readings: dict[str, Any], need: Request, held: list[Grant],
              shadows: Iterable[Grant] = ()) -> Grant | None:
    """The grant `need` would get once the worker's running jobs (`held`) end, their
    VRAM off the live reading, beside the capacity already held back (`shadows`); None
    when it would not fit even then (it waits for something else: another program's
    VRAM, a smaller worker). The claim keeps that grant from lower priorities."""
    if not held:
        return None  # nothing of ours to wait for: the refusal stands on its own
    devices = []
    for index, d in _devices(readings):
        d = {**d, "index": index}
        used, total = _num(d.get("memory_used_mb")), _num(d.get("memory_total_mb"))
        if used is not None and total is not None:
            booked = sum(total if h.vram_mb == 0 else h.vram_mb
                         for h in held if index in h.gpu_ids)
            d["memory_used_mb"] = max(0.0, used - booked)
        devices.append(d)
    got = fit({**readings, "gpu_devices": devices}, need, list(shadows))
    return None if isinstance(got, str) else got


SHORTFALL_PIECES_MAX = 8  # amounts named in one reason; the rest are counted


def shortfall(need: Request, workers: Iterable[tuple[Any, ...]],
              grants: dict[str, list[Grant]]) -> str | None:
    """Why a runnable job needing `need` waits, over the workers that could otherwise run
    it (live, its role and kind, gates open: the caller picks them), in one sentence per
    resource short: `waiting for resources: vram: need 8000 MiB; free: 3100 on
    box1/gpu0, 2000 on box1/gpu2`; None when one has room (or none is given).
    `workers` are (worker_id, roles, readings, ...) rows."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for worker_id, _roles, readings, *_ in workers:
        got = check(readings if isinstance(readings, dict) else {}, need,
                    grants.get(worker_id, ()))
        if not isinstance(got, Short):
            return None
        pieces = [f"{amount} on {worker_id}/{where}" if where else f"{amount} on {worker_id}"
                  for where, amount in got.pieces]
        pieces[-1] += got.note
        groups.setdefault((got.resource, got.need, got.label), []).extend(pieces)
    if not groups:
        return None
    said = []
    for (resource, asked, label), pieces in groups.items():
        shown = ", ".join(pieces[:SHORTFALL_PIECES_MAX])
        if len(pieces) > SHORTFALL_PIECES_MAX:
            shown += f" and {len(pieces) - SHORTFALL_PIECES_MAX} more"
        said.append(f"{resource}: need {asked}; {label}: {shown}")
    return "waiting for resources: " + " | ".join(said)


def _free(gpu: Gpu, held: list[Grant]) -> float:
    """VRAM free on `gpu`: its total less what leases were granted there, and no more than
    its live reading shows."""
    booked = sum(gpu.total_mb if h.vram_mb == 0 else h.vram_mb
                 for h in held if gpu.index in h.gpu_ids)
    free = gpu.total_mb - booked
    if gpu.used_mb is not None:
        free = min(free, gpu.total_mb - gpu.used_mb)
    return free


def summary(readings: dict[str, Any], held: Iterable[Grant],
            reserved: Iterable[Request] = ()) -> dict[str, Any]:
    """For `coordctl workers`: per GPU total/used/held MiB and temperature, RAM
    capacity/held, and what reservations ask for; {} for a worker advertising nothing."""
    held, reserved = list(held), list(reserved)
    gpus, ram = gpus_of(readings), _num(readings.get("ram_mb"))
    if not gpus and ram is None:
        return {}
    devices = dict(_devices(readings))
    out: dict[str, Any] = {"gpus": [{
        "index": g.index, "memory_total_mb": g.total_mb, "memory_used_mb": g.used_mb,
        "held_mb": g.total_mb - _free(Gpu(g.index, g.total_mb, None), held),
        "free_mb": max(0.0, _free(g, held)),
        "temperature_c": _num(devices.get(g.index, {}).get("gpu_temperature_c")),
        "utilization_pct": _num(devices.get(g.index, {}).get("utilization_pct")),
    } for g in gpus]}
    if ram is not None:
        used = sum(h.ram_mb for h in held)
        out["ram"] = {"capacity_mb": ram, "held_mb": used, "free_mb": max(0.0, ram - used)}
    if reserved:
        out["reserved"] = {"gpus": sum(r.gpus for r in reserved),
                           "vram_mb": sum(r.vram_mb for r in reserved),
                           "ram_mb": sum(r.ram_mb for r in reserved)}
    return out


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _finite(value: Any) -> bool:
    return _num(value) is not None and math.isfinite(value)
