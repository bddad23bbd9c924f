"""The NVML sampler's selection and conversion logic, on values in the form NVML returns them.

No GPU here: a small stand-in for the ``pynvml`` module answers with fixed readings of an
8-GPU H100 host (one GPU in MIG mode). Each function is called exactly as the sampler calls
the real one; the values are typical of such a host (H100 SXM: 80 GiB, 700 W cap, energy
counter in mJ since the driver loaded).
"""

from __future__ import annotations

import types

import pytest

from tandem.watch.samplers.nvml import (
    GpuDevice,
    GpuReading,
    GpuState,
    NvmlSampler,
    reading_metrics,
    select_visible,
)

GPUS = [
    GpuDevice(i, f"GPU-{i}aaaaaaa-1111-2222-3333-44444444444{i}", "NVIDIA H100 80GB HBM3") for i in range(4)
]
GPUS[3] = GpuDevice(
    3,
    GPUS[3].uuid,
    GPUS[3].name,
    ("MIG-aaaa1111-0000-0000-0000-000000000000", "MIG-bbbb2222-0000-0000-0000-000000000000"),
)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]),  # unset: every GPU
        ("", []),  # empty: none
        ("2,0", ["GPU-2", "GPU-0"]),  # the run's cuda:0 is physical GPU 2
        ("1,7,2", ["GPU-1"]),  # CUDA stops at the first entry that names no device
        ("1,-1,2", ["GPU-1"]),
        ("1,1", ["GPU-1"]),  # a repeat ends the list too
        ("GPU-2aaa", ["GPU-2"]),  # a unique UUID prefix
        ("GPU-", []),  # ambiguous prefix: nothing
        ("MIG-bbbb2222", ["MIG-bbbb2222"]),
        (" 0 , 1 ", ["GPU-0", "GPU-1"]),
    ],
)
def test_visible_devices_follow_cuda_rules(spec, expected):
    chosen = select_visible(spec, GPUS)
    assert [d.uuid[: len(e)] for d, e in zip(chosen, expected)] == expected
    assert len(chosen) == len(expected)
    assert [d.ordinal for d in chosen] == list(range(len(expected)))


def test_mig_device_knows_its_parent():
    (d,) = select_visible("MIG-aaaa1111-0000-0000-0000-000000000000", GPUS)
    assert d.mig and d.parent_index == 3


def test_reading_conversion_units_energy_delta_and_run_memory():
    state = GpuState()
    run = {4242, 4243}
    first = GpuReading(
        utilization_percent=87,
        memory_used_bytes=40 * 2**30,
        memory_total_bytes=80 * 2**30,
        power_mw=412_345,
        energy_mj=1_234_567_890,
        processes=((4242, 30 * 2**30), (4243, 2 * 2**30), (999, 8 * 2**30), (4244, None)),
    )
    m = reading_metrics(0, first, state, run, now=100.0)
    assert m["system/gpu_0/utilization_percent"] == 87
    assert m["system/gpu_0/power_watts"] == pytest.approx(412.345)
    assert m["system/gpu_0/memory_used_percent"] == pytest.approx(50.0)
    assert m["system/gpu_0/run_memory_bytes"] == 32 * 2**30, "only the run's processes; None counts 0"
    assert m["system/gpu_0/run_processes"] == 2
    assert m["system/gpu_0/energy_measured_joules"] == 0.0, "energy is a delta over the run"
    second = GpuReading(power_mw=400_000, energy_mj=1_234_567_890 + 41_234)
    m = reading_metrics(0, second, state, run, now=101.0)
    assert m["system/gpu_0/energy_measured_joules"] == pytest.approx(41.234)
    reset = GpuReading(energy_mj=5_000)  # driver reloaded: the counter restarted
    m = reading_metrics(0, reset, state, run, now=102.0)
    assert m["system/gpu_0/energy_measured_joules"] == pytest.approx(41.234), "no jump on a reset"
    m = reading_metrics(0, GpuReading(energy_mj=6_000), state, run, now=103.0)
    assert m["system/gpu_0/energy_measured_joules"] == pytest.approx(42.234)


def test_no_energy_counter_means_an_estimate_named_so():
    state = GpuState()
    m = reading_metrics(1, GpuReading(power_mw=100_000), state, [], now=0.0)
    m = reading_metrics(1, GpuReading(power_mw=300_000), state, [], now=2.0)
    assert m["system/gpu_1/energy_estimated_joules"] == pytest.approx(400.0)  # trapezoid: 200 W x 2 s
    assert not any("measured" in k for k in m)


class FakeNvml(types.SimpleNamespace):
    """Answers like pynvml for a host with the GPUS above; raises where NVML would."""

    class NotSupported(Exception):
        pass

    def __init__(self):
        super().__init__(calls=[])
        self.handles = {d.uuid: ("gpu", d.index) for d in GPUS}

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(GPUS)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetUUID(self, h):
        return GPUS[h[1]].uuid.encode() if h[0] == "gpu" else GPUS[3].mig_uuids[h[1]]

    def nvmlDeviceGetName(self, h):
        return GPUS[h[1]].name

    def nvmlDeviceGetMigMode(self, h):
        return (1, 1) if h[1] == 3 else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j >= 2:
            raise self.NotSupported("empty slot")
        return ("mig", j)

    def nvmlDeviceGetUtilizationRates(self, h):
        if h[0] == "mig":
            raise self.NotSupported("utilisation is not supported on MIG devices")
        return types.SimpleNamespace(gpu=55, memory=20)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=10 * 2**30, total=80 * 2**30 if h[0] == "gpu" else 10 * 2**30)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=777, usedGpuMemory=3 * 2**30)]

    def nvmlDeviceGetPowerUsage(self, h):
        return 250_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.calls.append("energy")
        return 10_000_000 + 250 * self.calls.count("energy")

    def nvmlGpmQueryDeviceSupport(self, h):
        return types.SimpleNamespace(isSupportedDevice=0)  # pre-Hopper: no GPM


def test_sampler_reads_only_visible_devices_and_skips_whole_gpu_power_on_mig():
    fake = FakeNvml()
    s = NvmlSampler(lambda: {777}, env={"CUDA_VISIBLE_DEVICES": f"1,{GPUS[3].mig_uuids[1]}"}, nvml=fake)
    assert s.available() == (True, "")
    assert s.tags() == {"tandem.gpu_0": GPUS[1].uuid, "tandem.gpu_1": GPUS[3].mig_uuids[1]}
    s.sample()
    m = s.sample()
    assert m["system/gpu_0/utilization_percent"] == 55
    assert m["system/gpu_0/energy_measured_joules"] == pytest.approx(0.25)
    assert m["system/gpu_0/run_memory_bytes"] == 3 * 2**30
    assert "system/gpu_1/utilization_percent" not in m, "MIG: not supported, not made up"
    assert "system/gpu_1/power_watts" not in m and "system/gpu_1/energy_measured_joules" not in m
    assert m["system/gpu_1/memory_total_bytes"] == 10 * 2**30
    assert not any(k.startswith("system/gpu_2") for k in m), "GPUs the run cannot see are not logged"
    s.close()
    assert fake.calls[-1] == "shutdown"


def test_sampler_says_why_when_unavailable():
    class NoDriver(FakeNvml):
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    s = NvmlSampler(lambda: (), nvml=NoDriver())
    ok, why = s.available()
    assert not ok and "NVML cannot start here" in why
    s = NvmlSampler(lambda: (), env={"CUDA_VISIBLE_DEVICES": ""}, nvml=FakeNvml())
    ok, why = s.available()
    assert not ok and "the run sees no GPU" in why


def test_real_nvml_on_this_machine_is_either_usable_or_says_why():
    ok, why = NvmlSampler(lambda: ()).available()
    assert ok or why, "a reason whenever it is not usable"
