"""What the worker advertises for resource admission (coordd.rules.resources), and a job's GPUs.

The probes measure (worker.probes, worker.gpu); this module applies the config's
`[resources]` overrides to that reading, adds the kinds' default requests
(`kind_resources`), and gives a model the GPUs coordd granted its job
(`CUDA_VISIBLE_DEVICES`). coordd decides; the worker only advertises and applies.
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordd.wire.protocol import ClaimedJob
from coordd.rules.resources import GPU_DEVICES_MAX
from worker.config import WorkerConfig

KIND_RESOURCES = "kind_resources"


def advertise(config: WorkerConfig, readings: dict[str, Any]) -> dict[str, Any]:
    """`readings` with the config's resource overrides and the kinds' defaults applied
    (a new dict)."""
    out = dict(readings)
    res = config.resources
    if res.ram_mb is not None:
        out["ram_mb"] = res.ram_mb
    if res.gpus is not None:
        devices = [d for d in out.get("gpu_devices") or () if isinstance(d, dict)]
        devices = devices[:res.gpus]
        taken = {d.get("index", i) for i, d in enumerate(devices)}
        free = (i for i in range(GPU_DEVICES_MAX) if i not in taken)
        for _, i in zip(range(len(devices), res.gpus), free):  # GPUs NVML cannot see
            devices.append({"index": i, "memory_total_mb": res.gpu_memory_mb,
                            "memory_used_mb": None, "gpu_temperature_c": None,
                            "utilization_pct": None, "source": "config"})
        out["gpu_devices"], out["gpus"] = devices, len(devices)
        if not devices:
            out["gpu_reason"] = "resources.gpus = 0 in the worker config"
    if isinstance(out.get("gpu_devices"), list):  # a readings override may name only the list
        out["gpus"] = len(out["gpu_devices"])
    defaults = {name: msgspec.structs.asdict(k.resources) for name, k in config.kinds.items()
                if k.resources is not None and not k.resources.empty}
    if defaults:
        out[KIND_RESOURCES] = defaults
    return out


def job_env(job: ClaimedJob) -> dict[str, str]:
    """The environment that confines a model to the GPUs granted to its job: none granted
    and the job asked for nothing -> {} (the machine's default).

    The granted ids are NVML indexes, which are in PCI bus order; CUDA numbers devices
    fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so that is set with them.
    """
    if job.gpu_ids:
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in job.gpu_ids),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return {}


def holds_gpu(job: ClaimedJob) -> bool:
    """Whether the job was granted GPUs (its end frees VRAM coordd must see soon)."""
    return bool(job.gpu_ids)
