"""GPU readings coordd can trust (a break trial of issue 16 item 3): a heartbeat's
`gpu_devices` is bounded and checked at the boundary, and the arithmetic never grants a
GPU twice, an index out of range, or a whole GPU another program fills."""

from __future__ import annotations

import pytest

from coordd import errors
from coordd.rules import resources
from coordd.wire.protocol import Heartbeat
from coordd.rules.resources import GPU_DEVICES_MAX, WHOLE_GPU_USED_MAX_MB, Grant, Request
from tests.conftest import COOL


def gpu(index, total=80000, used=0, **extra):
    return {"index": index, "memory_total_mb": total, "memory_used_mb": used, **extra}


async def beat(bundle, devices, **readings):
    return await bundle.coord.heartbeat(Heartbeat(
        worker_id="w1", roles=["cpu"], readings={**COOL, "gpu_devices": devices, **readings}))


@pytest.mark.parametrize("devices,extra,message", [
    ([gpu(i, 1000, 1000) for i in range(GPU_DEVICES_MAX + 1)], {},
     r"readings\.gpu_devices: at most 64 devices, got 65"),
    ([gpu(0), gpu(0)], {}, r"readings\.gpu_devices\[1\]\.index: 0 is listed twice"),
    ([gpu(10 ** 18)], {}, r"gpu_devices\[0\]\.index must be an integer 0\.\.63, got 10+"),
    ([gpu(-1)], {}, r"gpu_devices\[0\]\.index must be an integer 0\.\.63, got -1"),
    ([gpu(True)], {}, r"gpu_devices\[0\]\.index must be an integer"),
    ([gpu(0, total=0)], {}, r"gpu_devices\[0\]\.memory_total_mb must be a finite number"),
    ([gpu(0, total=1e12)], {}, r"gpu_devices\[0\]\.memory_total_mb must be a finite"),
    ([gpu(0, total=float("nan"))], {}, r"gpu_devices\[0\]\.memory_total_mb must be"),
    ([gpu(0, total=float("inf"))], {}, r"gpu_devices\[0\]\.memory_total_mb must be"),
    ([gpu(0, used=90000)], {}, r"gpu_devices\[0\]\.memory_used_mb must be null or 0\.\.80000"),
    ([gpu(0, used=-1)], {}, r"gpu_devices\[0\]\.memory_used_mb must be null or 0\.\."),
    ([gpu(0, used=float("nan"))], {}, r"gpu_devices\[0\]\.memory_used_mb must be null"),
    ([gpu(0, gpu_temperature_c=float("inf"))], {}, r"\[0\]\.gpu_temperature_c must be null"),
    ([gpu(0, utilization_pct=float("nan"))], {}, r"\[0\]\.utilization_pct must be null"),
    ([gpu(0)], {"gpus": 2}, r"readings\.gpus: 2 but gpu_devices lists 1"),
    (None, {"gpus": 1}, r"readings\.gpus: 1 but no gpu_devices list them"),
    ([5], {}, r"readings"),  # not a map: the Readings types refuse it first
])
async def test_a_heartbeat_with_gpu_readings_admission_cannot_trust_is_refused(
        bundle, devices, extra, message):
    await beat(bundle, [gpu(0, 16000, 0)])
    with pytest.raises(errors.BadRequest, match=message):
        await beat(bundle, devices, **extra)
    w = (await bundle.coord.workers()).workers[0]  # the last good heartbeat stays
    assert w.readings["gpu_devices"] == [gpu(0, 16000, 0)]


async def test_up_to_64_devices_positional_or_indexed_are_accepted(bundle):
    await beat(bundle, [gpu(i, 1000, 1000) for i in range(GPU_DEVICES_MAX)],
               gpus=GPU_DEVICES_MAX)
    await beat(bundle, [{"memory_total_mb": 1000, "memory_used_mb": None}] * 2)
    await beat(bundle, [gpu(3), gpu(1)], gpus=2)  # a confined worker: NVML indexes kept
    await beat(bundle, [], gpus=0)


def test_a_whole_gpu_is_granted_only_when_the_live_reading_shows_it_idle():
    full = {"gpu_devices": [gpu(0, 80000, 80000)]}
    assert resources.fit(full, Request(gpus=1), []) == (
        "gpus: need 1 whole, 0 of 1 free; gpu0 shows 80000 MiB in use (a whole GPU needs "
        f"<= {WHOLE_GPU_USED_MAX_MB})")
    both = {"gpu_devices": [gpu(0, 80000, 80000), gpu(1, 80000, WHOLE_GPU_USED_MAX_MB)]}
    assert resources.fit(both, Request(gpus=1), []) == Grant(gpu_ids=(1,))
    unread = {"gpu_devices": [gpu(0, 8000, None)]}  # a GPU from the config: arithmetic only
    assert resources.fit(unread, Request(gpus=1), []) == Grant(gpu_ids=(0,))


def test_stored_readings_from_before_the_checks_never_grant_a_gpu_twice_or_out_of_range():
    dup = {"gpu_devices": [gpu(0), gpu(0)]}
    assert resources.fit(dup, Request(gpus=2), []) == "gpus: need 2, the worker has 1"
    assert resources.fit(dup, Request(gpus=2, vram_mb=10), []) == \
        "gpus: need 2, the worker has 1"
    assert resources.fit(dup, Request(gpus=1), []) == Grant(gpu_ids=(0,))
    huge = {"gpu_devices": [gpu(10 ** 18), gpu(-1), gpu(64)]}
    assert resources.gpus_of(huge) == []
    assert resources.fit(huge, Request(gpus=1), []) == "gpus: need 1, the worker has 0"


def test_one_index_rule_for_admission_preemption_and_the_summary():
    positional = {"gpu_devices": [{"memory_total_mb": 10000, "memory_used_mb": 0},
                                  {"memory_total_mb": 10000, "memory_used_mb": 9000}]}
    assert [g.index for g in resources.gpus_of(positional)] == [0, 1]
    victim = Grant(gpu_ids=(1,), vram_mb=9000)
    others = Grant(gpu_ids=(0,), vram_mb=10000)
    need = Request(gpus=1, vram_mb=8000)
    assert isinstance(resources.fit(positional, need, [victim, others]), str)
    assert resources.fits_without(positional, need, [victim, others], victim)
    assert not resources.fits_without(positional, need, [victim, others], None)
    s = resources.summary(positional, [victim])
    assert [(g["index"], g["held_mb"], g["free_mb"]) for g in s["gpus"]] == \
        [(0, 0.0, 10000.0), (1, 9000.0, 1000.0)]
