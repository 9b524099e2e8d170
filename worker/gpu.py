"""GPU readings through NVML (the `nvidia-ml-py` package, module `pynvml`) for the heartbeat.

`pynvml` is imported on the first read, not at import time (it is the optional extra
`gpu`). No package, no NVIDIA library, no driver: zero GPUs and the reason, never an
exception; NVML's errors are caught here and nowhere else. A failed start is remembered:
the probe does not retry NVML on every heartbeat (restart the worker after installing a
driver).
An inherited CUDA_VISIBLE_DEVICES confines the worker (NVML itself ignores it): only the
devices it names are advertised, each under its NVML index (`visible_devices`).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

MIB = 1 << 20
FROM_ENV = "\0environ"  # GpuProbe's cuda_visible default: read the worker's environment
GPU_KEYS = ("gpus", "gpu_devices", "gpu_temperature_c", "gpu_reason")
"""The heartbeat keys this probe sets."""


def load_pynvml() -> Any:
    """Import `pynvml` (raises ImportError when nvidia-ml-py is not installed)."""
    return importlib.import_module("pynvml")


def no_gpus(reason: str) -> dict[str, Any]:
    """The readings of a machine without (readable) GPUs."""
    return {"gpus": 0, "gpu_devices": [], "gpu_temperature_c": None, "gpu_reason": reason}


def visible_devices(value: str | None, uuids: list[str]) -> tuple[list[int] | None, str | None]:
    """The NVML indexes a CUDA_VISIBLE_DEVICES `value` names, with a note on what it skipped.

    `uuids` are the NVML devices' UUIDs by index. None: the variable is unset (every
    device). Entries are indexes or GPU UUIDs (`GPU-...`, a unique prefix is enough); as
    in CUDA, the list ends at the first entry that names no device. MIG ids are not
    resolved: such an entry ends the list too (its device is not advertised).
    """
    if value is None:
        return None, None
    out: list[int] = []
    if not value.strip():
        return out, None
    for entry in (e.strip() for e in value.split(",")):
        index: int | None = None
        if entry.isdigit():
            index = int(entry) if int(entry) < len(uuids) else None
        elif entry.startswith("GPU-"):
            hits = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            index = hits[0] if len(hits) == 1 else None
        if index is None:
            return out, (f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} names no NVML device "
                         "(MIG ids are not supported); later entries are ignored, as CUDA does")
        if index not in out:
            out.append(index)
    return out, None


class GpuProbe:
    """Read every NVIDIA GPU: memory total/used (MiB), temperature (C), utilization (%).

    Args:
        load: returns the `pynvml` module (tests pass a fake module object).
        cuda_visible: the worker's CUDA_VISIBLE_DEVICES (default: from the environment);
            only the devices it names are read.
    """

    def __init__(self, load: Callable[[], Any] = load_pynvml,
                 cuda_visible: str | None = FROM_ENV) -> None:
        self._load = load
        self._visible = (os.environ.get("CUDA_VISIBLE_DEVICES") if cuda_visible == FROM_ENV
                         else cuda_visible)
        self._nvml: Any = None
        self._failed: str | None = None

    def read(self) -> dict[str, Any]:
        """One reading of GPU_KEYS; never raises."""
        if self._failed is not None:
            return no_gpus(self._failed)
        try:
            if self._nvml is None:
                self._nvml = self._start()
            return self._devices(self._nvml)
        except ImportError as exc:
            return self._fail(f"nvidia-ml-py not installed (pip install 'coordd[gpu]'): {exc}")
        except Exception as exc:  # noqa: BLE001 - NVMLError_* (LibraryNotFound, DriverNotLoaded...)
            if self._nvml is None:
                return self._fail(f"NVML: {type(exc).__name__}: {exc}")
            logger.warning("NVML read failed: %s", exc, extra={"action": "gpu_read_failed"})
            return no_gpus(f"NVML read failed: {type(exc).__name__}: {exc}")

    def _start(self) -> Any:
        nvml = self._load()
        nvml.nvmlInit()
        return nvml

    def _fail(self, reason: str) -> dict[str, Any]:
        self._failed = reason
        logger.info("no GPU readings: %s", reason, extra={"action": "gpu_unavailable"})
        return no_gpus(reason)

    def _devices(self, nvml: Any) -> dict[str, Any]:
        devices = []
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        uuids = [_text(_optional(nvml, nvml.nvmlDeviceGetUUID, h)) or "" for h in handles]
        indexes, note = visible_devices(self._visible, uuids)
        for i in range(len(handles)) if indexes is None else indexes:
            h = handles[i]
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            temp = _optional(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            util = _optional(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
            name = _optional(nvml, nvml.nvmlDeviceGetName, h)
            devices.append({
                "index": i,
                "name": _text(name),
                "uuid": uuids[i] or None,
                "memory_total_mb": round(mem.total / MIB),
                "memory_used_mb": round(mem.used / MIB),
                "gpu_temperature_c": None if temp is None else float(temp),
                "utilization_pct": None if util is None else float(util.gpu),
            })
        temps = [d["gpu_temperature_c"] for d in devices if d["gpu_temperature_c"] is not None]
        reason = note
        if not devices and reason is None:
            reason = ("CUDA_VISIBLE_DEVICES names no GPU" if indexes is not None
                      else "NVML sees no GPU")
        return {"gpus": len(devices), "gpu_devices": devices,
                "gpu_temperature_c": max(temps) if temps else None, "gpu_reason": reason}


def _text(value: Any) -> Any:
    """NVML strings: bytes in older nvidia-ml-py releases, str in newer ones."""
    return value.decode() if isinstance(value, bytes) else value


def _optional(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """A reading some GPUs do not support (NVMLError_NotSupported): None then."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


if __name__ == "__main__":  # `python -m worker.gpu`: what this machine's heartbeat would say
    import json
    print(json.dumps(GpuProbe().read(), indent=2))
