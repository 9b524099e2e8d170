"""A fake `pynvml` (nvidia-ml-py's module) for tests: no GPU is ever touched.

Its GPUs come from the JSON file named by FAKE_NVML_STATE, re-read on every call so a
test can change the free memory live: {"gpus": [{"total_mb", "used_mb", "temp",
"util", "name", "uuid"}], "init_error": "LibraryNotFound" | "DriverNotLoaded" | null}. Put this
folder on PYTHONPATH (a real worker process) or load the module and inject it
(worker.gpu.GpuProbe(load=...)).
"""

import json
import os

NVML_TEMPERATURE_GPU = 0
MIB = 1 << 20


class NVMLError(Exception):
    def __init__(self, value=0):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {9: "Driver Not Loaded", 12: "NVML Shared Library Not Found",
                3: "Not Supported"}.get(self.value, f"NVML error {self.value}")


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self):
        super().__init__(9)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self):
        super().__init__(12)


class NVMLError_NotSupported(NVMLError):
    def __init__(self):
        super().__init__(3)


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _state():
    with open(os.environ["FAKE_NVML_STATE"], encoding="utf-8") as fh:
        return json.load(fh)


def _gpu(handle):
    return _state()["gpus"][handle]


def nvmlInit():
    err = _state().get("init_error")
    if err:
        raise globals()[f"NVMLError_{err}"]()


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_state()["gpus"])


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetMemoryInfo(h):
    g = _gpu(h)
    return _Obj(total=g["total_mb"] * MIB, used=g["used_mb"] * MIB,
                free=(g["total_mb"] - g["used_mb"]) * MIB)


def nvmlDeviceGetTemperature(h, sensor):
    temp = _gpu(h).get("temp")
    if temp is None:
        raise NVMLError_NotSupported()
    return temp


def nvmlDeviceGetUtilizationRates(h):
    return _Obj(gpu=_gpu(h).get("util", 0), memory=0)


def nvmlDeviceGetName(h):
    return _gpu(h).get("name", "Fake GPU").encode()


def nvmlDeviceGetUUID(h):
    return _gpu(h).get("uuid", f"GPU-{h:08x}-fake-0000-0000-000000000000")
