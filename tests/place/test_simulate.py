"""The simulator: small cases computed by hand from the slowdown model (serial, co-run,
settle delay, the compute gate, probes, OOM with escalating retries, priority), then the
sample trace under every policy, 1,000 jobs on 64 GPUs, and the report."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from tandem.place.policies import POLICIES, Limits
from tandem.place.sim.replay import compare, run_simulations, write_report
from tandem.place.sim.simulate import AGGREGATE_KEYS, GPU_IDLE_W, GPU_MAX_W, SlowdownModel, simulate
from tandem.place.sim.trace import GiB, TraceJob, sample_trace, trace_job

MODEL = SlowdownModel()
NO_SETTLE = Limits(settle_s=0)


def job(
    name: str,
    at: float = 0.0,
    compute: float = 0.3,
    duration: float = 100.0,
    gpu_mem: int | None = 4 * GiB,
    peak: int | None = None,
    priority: int = 0,
    gpus: int = 1,
    cpus: float = 1.0,
) -> TraceJob:
    return trace_job(at, name, "", cpus, GiB, gpus, gpu_mem, duration, compute, "", priority, peak)


def times(result) -> list[tuple[float | None, float | None]]:
    return [(j.start, j.end) for j in result.jobs]


def approx(x):
    return pytest.approx(x, abs=1e-6)


def test_slowdown_model_formula():
    assert MODEL.gpu(0.6, 2) == approx(1.05)  # light + light: nearly free
    assert MODEL.gpu(1.2, 2) == approx(1.2 * 1.05)  # past the whole GPU: about proportional
    assert MODEL.gpu(0.9, 1) == 1.0
    assert SlowdownModel(alpha=2.0, beta=0.1).gpu(1.5, 3) == approx(1.5**2 * 1.2)
    assert MODEL.host(32, 64) == 1.0 and MODEL.host(96, 64) == approx(1.5)


def test_two_light_jobs_exclusive_run_one_after_the_other():
    r = simulate([job("a"), job("b")], "exclusive", gpus=1)
    assert times(r) == [(0.0, 100.0), (100.0, 200.0)]
    assert r.makespan_s == approx(200.0)
    assert r.jct_mean_s == approx(150.0) and r.wait_mean_s == approx(50.0)
    assert r.slowdown_mean == approx(1.0)
    assert r.gpu_util == approx(1.0)
    # Energy: one GPU at activity 0.3 for 200 s.
    assert r.energy_kwh_estimated == approx(200 * (GPU_IDLE_W + (GPU_MAX_W - GPU_IDLE_W) * 0.3) / 3.6e6)


def test_two_light_jobs_packing_co_run():
    s = MODEL.gpu(0.3 + 0.3, 2)  # 1.05
    # No settle: the second starts as soon as the first is no longer fresh, at once.
    r = simulate([job("a"), job("b")], "packing", gpus=1, limits=NO_SETTLE)
    assert times(r) == [(0.0, approx(100 * s)), (0.0, approx(100 * s))]
    assert r.makespan_s == approx(105.0)
    assert r.slowdown_max == approx(s)
    # Energy over the makespan only (not up to the starvation limits still pending).
    assert r.energy_kwh_estimated == approx(105 * (GPU_IDLE_W + (GPU_MAX_W - GPU_IDLE_W) * 0.6) / 3.6e6)
    # settle_s=10: b waits for a to settle (10 s alone: its compute was not declared and
    # is not measured yet), then both at 1/s; a ends, b alone.
    r = simulate([job("a"), job("b")], "packing", gpus=1, limits=Limits(settle_s=10))
    a_end = 10 + (100 - 10) * s
    b_end = a_end + (100 - (a_end - 10) / s)
    assert times(r) == [(0.0, approx(a_end)), (10.0, approx(b_end))]
    assert (a_end, b_end) == (approx(104.5), approx(114.5))
    assert r.makespan_s == approx(114.5)


def test_first_fit_does_not_wait_for_settling():
    # Only packing gates on fresh measurements; first-fit collocates at once.
    r = simulate([job("a"), job("b")], "first-fit", gpus=1, limits=Limits(settle_s=30))
    assert r.makespan_s == approx(100 * MODEL.gpu(0.6, 2))


def test_heavy_job_blocks_packing_collocation():
    jobs = [job("heavy", compute=0.9), job("light", at=1.0)]
    r = simulate(jobs, "packing", gpus=1, limits=NO_SETTLE)
    assert times(r) == [(0.0, 100.0), (100.0, 200.0)]  # p95 0.9 >= 0.80: the light one waits
    assert r.jobs[1].wait_s == approx(99.0)
    # first-fit has no compute gate: they co-run from t=1 at max(1, 1.2) * 1.05.
    r = simulate(jobs, "first-fit", gpus=1, limits=NO_SETTLE)
    s = MODEL.gpu(1.2, 2)
    heavy_end = 1 + 99 * s
    light_end = heavy_end + (100 - (heavy_end - 1) / s)
    assert times(r) == [(0.0, approx(heavy_end)), (1.0, approx(light_end))]


def test_probe_blocks_its_gpu_until_it_settles():
    jobs = [job("probe", gpu_mem=None, peak=20 * GiB), job("b")]
    r = simulate(jobs, "first-fit", gpus=1, limits=Limits(settle_s=30))
    s = MODEL.gpu(0.6, 2)
    probe_end = 30 + 70 * s
    b_end = probe_end + (100 - (probe_end - 30) / s)
    assert times(r) == [(0.0, approx(probe_end)), (30.0, approx(b_end))]
    assert (probe_end, b_end) == (approx(103.5), approx(133.5))
    # With a second GPU, b goes there at once: the probe blocks only its own GPU.
    r = simulate(jobs, "first-fit", gpus=2, limits=Limits(settle_s=30))
    assert times(r) == [(0.0, 100.0), (0.0, 100.0)]
    assert [j.gpus for j in r.jobs] == [[0], [1]]


def test_settled_probe_reserves_its_peak_plus_margin():
    # 80 GiB GPU: the probe reaches 60 GiB, so it reserves 66 GiB once settled; a 20 GiB job
    # then no longer fits beside it and waits for it to end.
    jobs = [job("probe", gpu_mem=None, peak=60 * GiB), job("big", at=40.0, gpu_mem=20 * GiB)]
    r = simulate(jobs, "first-fit", gpus=1, limits=Limits(settle_s=30))
    assert times(r) == [(0.0, 100.0), (100.0, 200.0)]
    assert r.oom_crashes == 0


def test_under_declared_job_crashes_once_and_is_retried_on_the_most_free_gpu():
    # b declares 10 GiB but reaches 60: beside a (40 GiB) on GPU 0 the GPU is 20 GiB short.
    # oom_after_s (10 s) after it starts, the newest job there (b) crashes and is retried at
    # escalation 1 (the GPU with most free memory: GPU 1), declaring 60 * 1.1 GiB.
    jobs = [job("a", gpu_mem=40 * GiB), job("b", gpu_mem=10 * GiB, peak=60 * GiB)]
    r = simulate(jobs, "first-fit", gpus=2, limits=Limits(settle_s=30))
    a, b = r.jobs
    s = MODEL.gpu(0.6, 2)
    assert (a.start, a.end, a.gpus, a.attempts) == (0.0, approx(10 + (100 - 10 / s)), [0], 1)
    assert (b.start, b.end, b.gpus, b.attempts, b.state) == (0.0, approx(110.0), [1], 2, "succeeded")
    assert b.run_s == approx(100.0) and b.wait_s == approx(0.0)  # the lost 10 s count as running
    assert (r.oom_crashes, r.retries) == (1, 1)


def test_second_crash_escalates_to_alone():
    # Both under-declare (10 GiB, reach 50) on one 80 GiB GPU. b crashes at 10; its retry
    # (55 GiB declared) fits a's 10 GiB reservation, so it starts at 10 and crashes again at
    # 20; the second retry runs alone, so it waits for a to end.
    jobs = [job("a", gpu_mem=10 * GiB, peak=50 * GiB), job("b", gpu_mem=10 * GiB, peak=50 * GiB)]
    r = simulate(jobs, "first-fit", gpus=1, limits=Limits(settle_s=30))
    a, b = r.jobs
    a_end = 20 + (100 - 20 / MODEL.gpu(0.6, 2))
    assert a.end == approx(a_end)
    assert (b.start, b.end, b.attempts, b.state) == (0.0, approx(a_end + 100), 3, "succeeded")
    assert (r.oom_crashes, r.retries) == (2, 2)


def test_job_that_never_fits_fails_after_its_retries():
    # Reaches 90 GiB of an 80 GiB GPU: crashes; once it declares 99 GiB it cannot fit at all.
    r = simulate([job("huge", gpu_mem=10 * GiB, peak=90 * GiB)], "first-fit", gpus=1)
    (huge,) = r.jobs
    assert (huge.state, huge.attempts, huge.end) == ("oom", 1, approx(10.0))
    assert (r.oom_crashes, r.retries) == (1, 0)
    assert r.aggregates()["failed"] == 1


def test_priority_order_is_respected():
    jobs = [job("first"), job("low", at=1.0), job("high", at=2.0, priority=5)]
    r = simulate(jobs, "exclusive", gpus=1)
    assert times(r) == [(0.0, 100.0), (200.0, 300.0), (100.0, 200.0)]


def test_cpu_only_jobs():
    jobs = [job("c1", gpus=0, gpu_mem=None, cpus=4, compute=1.0), job("c2", gpus=0, gpu_mem=None, cpus=4)]
    assert simulate(jobs, "exclusive", gpus=1).makespan_s == approx(200.0)
    assert simulate(jobs, "packing", gpus=1, limits=NO_SETTLE).makespan_s == approx(100.0)


def test_a_job_too_big_for_the_machine_is_refused():
    r = simulate([job("two", gpus=2), job("one")], "packing", gpus=1)
    assert [j.state for j in r.jobs] == ["refused", "succeeded"]
    assert r.aggregates()["refused"] == 1 and r.makespan_s == approx(100.0)


def test_deterministic_and_serialisable():
    trace = sample_trace(20, seed=3)
    a, b = simulate(trace, "packing", gpus=2), simulate(trace, "packing", gpus=2)
    assert a.aggregates() == b.aggregates()
    data = json.loads(json.dumps(a.to_dict()))
    assert set(data["aggregates"]) == set(AGGREGATE_KEYS)
    assert len(data["jobs"]) == 20 and data["model"] == {"alpha": 1.0, "beta": 0.05, "oom_after_s": 10.0}


def test_sample_trace_under_every_policy():
    results = run_simulations(sample_trace(60, seed=0), gpus=3)
    assert list(results) == list(POLICIES)
    for name, r in results.items():
        assert r.aggregates()["succeeded"] == 60, name
        assert r.oom_crashes == 0  # every job declares what it reaches
        print(name, {k: round(v, 2) for k, v in r.aggregates().items()})
    assert results["packing"].makespan_s < results["exclusive"].makespan_s
    assert results["packing"].jct_mean_s < results["exclusive"].jct_mean_s
    assert results["exclusive"].slowdown_max == approx(1.0)


def test_thousand_jobs_on_64_gpus():
    trace = sample_trace(1000, seed=1)
    started = time.perf_counter()
    r = simulate(trace, "packing", gpus=64)
    took = time.perf_counter() - started
    print(f"1,000 jobs on 64 GPUs (packing): {took:.2f} s")
    assert r.aggregates()["succeeded"] == 1000
    burst = [replace(j, offset_s=0.0) for j in trace]  # all at once: a 1,000-job queue
    started = time.perf_counter()
    r = simulate(burst, "first-fit", gpus=64)
    print(f"1,000 jobs at once on 64 GPUs (first-fit): {time.perf_counter() - started:.2f} s")
    assert r.aggregates()["succeeded"] == 1000


def test_report(tmp_path):
    results = run_simulations(sample_trace(12, seed=2), ["exclusive", "packing"], gpus=2)
    table = compare(results, title="12 jobs")
    assert [c.header for c in table.columns][:3] == ["policy", "makespan", "mean JCT"]
    assert table.row_count == 2
    # A live replay hands plain mappings with the same keys; missing ones show as "-".
    mixed = dict(results, live={"makespan_s": 4000.0, "jct_mean_s": 1800.0})
    assert compare(mixed).row_count == 3
    json_path, png_path = write_report(mixed, tmp_path / "out", "sample")
    data = json.loads(json_path.read_text())
    assert data["packing"]["aggregates"]["jobs"] == 12 and data["live"]["aggregates"]["makespan_s"] == 4000.0
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
