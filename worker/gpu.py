"""GPU readings through NVML (the `nvidia-ml-py` package, module `pynvml`) for the heartbeat.

`pynvml` is imported on the first read, not at import time (it is the optional extra
`gpu`). No package, no NVIDIA library, no driver: zero GPUs and the reason, never an
exception; NVML's errors are caught here and nowhere else. A failed start is remembered:
the probe does not retry NVML on every heartbeat (restart the worker after installing a
driver).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

MIB = 1 << 20
GPU_KEYS = ("gpus", "gpu_devices", "gpu_temperature_c", "gpu_reason")
"""The heartbeat keys this probe sets."""


def load_pynvml() -> Any:
    """Import `pynvml` (raises ImportError when nvidia-ml-py is not installed)."""
    return importlib.import_module("pynvml")


def no_gpus(reason: str) -> dict[str, Any]:
    """The readings of a machine without (readable) GPUs."""
    return {"gpus": 0, "gpu_devices": [], "gpu_temperature_c": None, "gpu_reason": reason}


class GpuProbe:
    """Read every NVIDIA GPU: memory total/used (MiB), temperature (C), utilization (%).

    Args:
        load: returns the `pynvml` module (tests pass a fake module object).
    """

    def __init__(self, load: Callable[[], Any] = load_pynvml) -> None:
        self._load = load
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
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            temp = _optional(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            util = _optional(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
            name = _optional(nvml, nvml.nvmlDeviceGetName, h)
            devices.append({
                "index": i,
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_total_mb": round(mem.total / MIB),
                "memory_used_mb": round(mem.used / MIB),
                "gpu_temperature_c": None if temp is None else float(temp),
                "utilization_pct": None if util is None else float(util.gpu),
            })
        temps = [d["gpu_temperature_c"] for d in devices if d["gpu_temperature_c"] is not None]
        return {"gpus": len(devices), "gpu_devices": devices,
                "gpu_temperature_c": max(temps) if temps else None,
                "gpu_reason": None if devices else "NVML sees no GPU"}


def _optional(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """A reading some GPUs do not support (NVMLError_NotSupported): None then."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


if __name__ == "__main__":  # `python -m worker.gpu`: what this machine's heartbeat would say
    import json
    print(json.dumps(GpuProbe().read(), indent=2))
