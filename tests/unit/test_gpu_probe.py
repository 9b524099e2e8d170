"""The GPU probe (issue 16, item 3) over an injected fake NVML module, the no-NVIDIA
path of this machine, and what the worker advertises from it (config overrides, kind
defaults, CUDA_VISIBLE_DEVICES)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from coordd.wire.protocol import ClaimedJob
from worker import config as wconfig
from worker import resources
from worker.gpu import GpuProbe
from worker.probes import Probes

FAKE = Path(__file__).resolve().parents[1] / "fake_nvml" / "pynvml.py"


@pytest.fixture
def nvml(tmp_path, monkeypatch):
    """The fake pynvml module and a function that sets its GPUs."""
    state = tmp_path / "nvml.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def set_state(gpus, init_error=None):
        state.write_text(json.dumps({"gpus": gpus, "init_error": init_error}))
    set_state([])
    return module, set_state


def test_reads_memory_temperature_and_utilization_per_gpu(nvml):
    module, set_state = nvml
    set_state([{"total_mb": 16384, "used_mb": 1000, "temp": 61, "util": 35, "name": "A"},
               {"total_mb": 8192, "used_mb": 8000, "temp": None, "util": 99}])
    r = GpuProbe(load=lambda: module).read()
    assert r["gpus"] == 2 and r["gpu_reason"] is None
    assert r["gpu_devices"][0] == {"index": 0, "name": "A", "memory_total_mb": 16384,
                                   "memory_used_mb": 1000, "gpu_temperature_c": 61.0,
                                   "utilization_pct": 35.0,
                                   "uuid": "GPU-00000000-fake-0000-0000-000000000000"}
    assert r["gpu_devices"][1]["gpu_temperature_c"] is None  # NotSupported: that field only
    assert r["gpu_temperature_c"] == 61.0
    set_state([{"total_mb": 16384, "used_mb": 9000, "temp": 70}])  # re-read each time
    assert GpuProbe(load=lambda: module).read()["gpu_devices"][0]["memory_used_mb"] == 9000


@pytest.mark.parametrize("error,words", [("LibraryNotFound", "Library Not Found"),
                                         ("DriverNotLoaded", "Driver Not Loaded")])
def test_no_driver_means_zero_gpus_and_a_reason_remembered(nvml, error, words):
    module, set_state = nvml
    set_state([{"total_mb": 1, "used_mb": 0}], init_error=error)
    calls = []
    probe = GpuProbe(load=lambda: calls.append(1) or module)
    r = probe.read()
    assert r["gpus"] == 0 and r["gpu_devices"] == [] and words in r["gpu_reason"]
    assert probe.read() == r and len(calls) == 1  # NVML is not tried on every heartbeat


def test_the_real_loader_never_raises_and_without_nvidia_ml_py_reads_zero_gpus():
    r = GpuProbe().read()  # this machine's own NVML, if any: never an exception
    assert set(r) >= {"gpus", "gpu_devices", "gpu_temperature_c", "gpu_reason"}
    if importlib.util.find_spec("pynvml") is None:  # the case here: the extra not installed
        assert r["gpus"] == 0 and "nvidia-ml-py not installed" in r["gpu_reason"]


def test_a_read_error_after_start_is_zero_gpus_not_a_crash(nvml):
    module, set_state = nvml
    set_state([{"total_mb": 100, "used_mb": 0}])
    probe = GpuProbe(load=lambda: module)
    assert probe.read()["gpus"] == 1
    module.nvmlDeviceGetMemoryInfo = lambda h: (_ for _ in ()).throw(module.NVMLError(15))
    r = probe.read()
    assert r["gpus"] == 0 and "NVML read failed" in r["gpu_reason"]
    heartbeat = Probes(gpu=lambda: 1 / 0, idle_sources=()).read()  # a broken provider
    assert heartbeat["gpus"] == 0 and "ZeroDivisionError" in heartbeat["gpu_reason"]
    assert heartbeat["ram_mb"] > 0


def test_config_overrides_kind_defaults_and_the_jobs_gpus():
    cfg = wconfig.parse('[resources]\ngpus = 2\ngpu_memory_mb = 8000\nram_mb = 4000\n'
                        '[kinds.embed]\nargv = ["x"]\nresources = {vram_mb = 3000}\n'
                        '[kinds.train]\nargv = ["y"]\n')
    seen = {"gpus": 1, "gpu_devices": [{"index": 0, "memory_total_mb": 24000,
                                        "memory_used_mb": 10}], "ram_mb": 64000}
    out = resources.advertise(cfg, seen)
    assert out["ram_mb"] == 4000 and out["gpus"] == 2
    assert out["gpu_devices"][0]["memory_total_mb"] == 24000  # NVML's reading kept
    assert out["gpu_devices"][1] == {"index": 1, "memory_total_mb": 8000,
                                     "memory_used_mb": None, "gpu_temperature_c": None,
                                     "utilization_pct": None, "source": "config"}
    assert out["kind_resources"] == {"embed": {"gpus": 1, "vram_mb": 3000, "ram_mb": 0}}
    off = resources.advertise(wconfig.parse("[resources]\ngpus = 0\n"), seen)
    assert off["gpus"] == 0 and "resources.gpus = 0" in off["gpu_reason"]
    job = ClaimedJob(job_id="j", kind="embed", required_role="r", priority=0, payload=None,
                     attempts=1, gpu_ids=[1, 3])
    assert resources.job_env(job) == {"CUDA_VISIBLE_DEVICES": "1,3",
                                      "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    with pytest.raises(wconfig.WorkerConfigError, match="unknown field `vram`"):
        wconfig.parse('[kinds.e]\nargv = ["x"]\nresources = {vram = 1}\n')


TWO = [{"total_mb": 81920, "used_mb": 0, "temp": 40, "name": "H100", "uuid": "GPU-aaaa-1111"},
       {"total_mb": 24576, "used_mb": 0, "temp": 40, "name": "4090", "uuid": "GPU-bbbb-2222"}]


@pytest.mark.parametrize("visible,indexes,reason", [
    (None, [0, 1], None),
    ("1", [1], None),
    ("1,0", [1, 0], None),
    (" GPU-bbbb ", [1], None),  # a UUID prefix, as CUDA takes it
    ("GPU-aaaa-1111,1", [0, 1], None),
    ("", [], "CUDA_VISIBLE_DEVICES names no GPU"),
    ("0,7,1", [0], "'7' names no NVML device"),  # CUDA stops at the first bad entry
    ("MIG-1234", [], "MIG ids are not supported"),
    ("-1", [], "'-1' names no NVML device"),
])
def test_an_inherited_cuda_visible_devices_confines_what_the_worker_advertises(
        nvml, monkeypatch, visible, indexes, reason):
    module, set_state = nvml
    set_state(TWO)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    r = GpuProbe(load=lambda: module).read()
    assert [d["index"] for d in r["gpu_devices"]] == indexes  # NVML's index kept
    assert r["gpus"] == len(indexes)
    assert [d["uuid"] for d in r["gpu_devices"]] == [TWO[i]["uuid"] for i in indexes]
    assert (reason is None and r["gpu_reason"] is None) or reason in r["gpu_reason"]


def test_config_gpus_beside_a_confined_probe_take_unused_indexes():
    cfg = wconfig.parse("[resources]\ngpus = 2\ngpu_memory_mb = 8000\n")
    seen = {"gpus": 1, "gpu_devices": [{"index": 0 + 1, "memory_total_mb": 24000,
                                        "memory_used_mb": 10}]}
    out = resources.advertise(cfg, seen)
    assert [d["index"] for d in out["gpu_devices"]] == [1, 0]  # never index 1 twice
    drill = resources.advertise(wconfig.parse(""), {"gpus": 0, "gpu_devices": [
        {"index": 0, "memory_total_mb": 8000, "memory_used_mb": 0}]})  # --readings-override
    assert drill["gpus"] == 1  # coordd refuses a count that disagrees with the list
