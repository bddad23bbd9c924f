"""The scheduler and the policies on hand-built device states (no processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tandem.place.policies import GpuSlot, HostSlot, Limits, make_policy
from tandem.place.scheduler import Waiting, fits_at_all, plan
from tests.place.needs import host_slot, waiting

G = 1 << 30
LIMITS = Limits()


def host(**kw) -> HostSlot:
    return host_slot(**{"cpus_total": 16, "mem_total": 128 * G, **kw})


def gpu(index: int, **kw) -> GpuSlot:
    return GpuSlot(**{"index": index, "uuid": f"GPU-{index}", "mem_total": 80 * G, **kw})


def job(
    i: int, gpu_mem: float | None = 10, gpus: int = 1, cpus: float = 1, priority: int = 0, **kw
) -> Waiting:
    mem = None if gpu_mem is None else int(gpu_mem * G)
    return waiting(i, priority, cpus=cpus, gpus=gpus, gpu_mem=mem, **kw)


def placed(policy: str, queue, gpus, h=None, limits=LIMITS, now=100.0):
    return {
        p.job_id: p.gpus for p in plan(queue, h or host(), gpus, make_policy(policy), limits, now).placements
    }


def test_exclusive_one_job_per_gpu_fifo() -> None:
    gpus = [gpu(0, jobs=1, mem_reserved=10 * G), gpu(1)]
    assert placed("exclusive", [job(1), job(2)], gpus) == {1: (1,)}
    # strict FIFO: a job that does not fit stops the queue (no backfill)
    assert placed("exclusive", [job(1, gpus=2), job(2)], gpus) == {}


def test_memory_policies_choose_as_named() -> None:
    gpus = [
        gpu(0, jobs=1, mem_reserved=50 * G),
        gpu(1, jobs=1, mem_reserved=20 * G),
        gpu(2, jobs=1, mem_reserved=65 * G),
    ]
    q = [job(1, gpu_mem=12)]
    assert placed("first-fit", q, gpus) == {1: (0,)}
    assert placed("best-fit", q, gpus) == {1: (2,)}  # 80-65-12 = 3 GiB left: the tightest fit
    assert placed("most-free-memory", q, gpus) == {1: (1,)}
    assert placed("first-fit", [job(1, gpu_mem=70)], gpus) == {}  # fits nowhere: waits


def test_reservations_add_up_within_one_pass() -> None:
    gpus = [gpu(0)]
    got = placed("first-fit", [job(i, gpu_mem=30) for i in range(4)], gpus)
    assert got == {0: (0,), 1: (0,)}  # 30+30 fit in 80; a third would not
    got = placed("first-fit", [job(i, gpu_mem=1) for i in range(10)], gpus, limits=Limits(max_per_gpu=3))
    assert len(got) == 3  # the per-GPU cap


def test_measured_memory_counts_only_once_settled() -> None:
    # Someone else's process uses 75 GiB: a settled GPU shows it; a fresh one is not trusted.
    settled = [gpu(0, jobs=1, mem_reserved=5 * G, mem_used=75 * G, activity_mean=0.1, activity_p95=0.1)]
    assert placed("first-fit", [job(1, gpu_mem=10)], settled) == {}
    fresh = [gpu(0, jobs=1, mem_reserved=5 * G, mem_used=75 * G, fresh=True)]
    assert placed("first-fit", [job(1, gpu_mem=10)], fresh) == {1: (0,)}
    # Packing waits for a measurement of the compute its jobs did not declare ...
    assert placed("packing", [job(1, gpu_mem=10)], fresh) == {}
    # ... but not where every job there declared its share of the GPU (--gpu-share).
    declared = [gpu(0, jobs=1, mem_reserved=5 * G, mem_used=75 * G, fresh=True, compute_declared=40)]
    assert placed("packing", [job(1, gpu_mem=10, gpu_share=40)], declared) == {1: (0,)}
    assert placed("packing", [job(1, gpu_mem=10, gpu_share=70)], declared) == {}  # 110% of the GPU
    # A job of unknown memory (a probe) waits for a measurement either way.
    assert placed("packing", [job(1, gpu_mem=None, gpu_share=10)], declared) == {}


def test_packing_spreads_then_packs_under_the_compute_gate() -> None:
    busy = dict(jobs=1, mem_reserved=10 * G, mem_used=12 * G)
    gpus = [gpu(0, **busy, activity_mean=0.3, activity_p95=0.4), gpu(1)]
    assert placed("packing", [job(1)], gpus) == {1: (1,)}  # an empty GPU first
    gpus = [
        gpu(0, **busy, activity_mean=0.5, activity_p95=0.6),
        gpu(1, **busy, activity_mean=0.2, activity_p95=0.3),
    ]
    assert placed("packing", [job(1)], gpus) == {1: (1,)}  # then the least busy
    gpus = [
        gpu(0, **busy, activity_mean=0.5, activity_p95=0.85),
        gpu(1, **busy, activity_mean=0.7, activity_p95=0.75),
    ]
    assert placed("packing", [job(1)], gpus) == {}  # p95 over 0.80 on one, mean over 0.60 on the other


def test_a_probe_goes_to_the_most_free_gpu_and_blocks_it() -> None:
    gpus = [
        gpu(0, jobs=1, mem_reserved=40 * G, mem_used=40 * G, activity_mean=0.1, activity_p95=0.1),
        gpu(1, jobs=1, mem_reserved=10 * G, mem_used=10 * G, activity_mean=0.1, activity_p95=0.1),
    ]
    got = plan(
        [job(1, gpu_mem=None), job(2, gpu_mem=1)], host(), gpus, make_policy("first-fit"), LIMITS, 100.0
    ).placements
    assert [(p.job_id, p.gpus, p.probe) for p in got] == [(1, (1,), True), (2, (0,), False)]
    assert placed("first-fit", [job(3)], [gpu(0, jobs=1, probing=True)]) == {}


def test_escalation_most_free_then_alone() -> None:
    gpus = [gpu(0, jobs=1, mem_reserved=10 * G), gpu(1, jobs=2, mem_reserved=20 * G)]
    assert placed("best-fit", [job(1, escalation=1)], gpus) == {1: (0,)}  # most free, not best fit
    assert placed("packing", [job(1, escalation=2)], gpus) == {}  # alone: no empty GPU
    got = plan(
        [job(1, escalation=2), job(2)], host(), [gpu(0)], make_policy("first-fit"), LIMITS, 100.0
    ).placements
    assert [(p.job_id, p.alone) for p in got] == [(1, True)]  # and no one joins it


def test_priorities_backfill_and_aging() -> None:
    gpus = [gpu(0, jobs=1, mem_reserved=60 * G)]
    q = [job(1, gpu_mem=30), job(2, gpu_mem=10), job(3, gpu_mem=5, priority=1)]
    got = plan(q, host(), gpus, make_policy("first-fit"), LIMITS, now=100.0).placements
    assert [p.job_id for p in got] == [3, 2]  # priority first; 1 does not fit and is passed over
    got = plan(q, host(), gpus, make_policy("first-fit"), Limits(starve_after_s=50), now=100.0).placements
    assert [p.job_id for p in got] == [3]  # 1 has waited 99 s > 50: nothing passes it


def test_cpu_only_jobs_reserve_cores_and_ram() -> None:
    h = host(cpus_total=2, mem_total=8 * G, mem_available=8 * G)
    q = [waiting(i, 0, float(i), cpus=1, mem=3 * G) for i in range(4)]
    assert len(plan(q, h, [], make_policy("first-fit"), LIMITS, 0.0).placements) == 2
    assert len(plan(q, h, [], make_policy("exclusive"), LIMITS, 0.0).placements) == 1
    busy = host(cpus_total=2, mem_total=8 * G, jobs=1, cpus_reserved=0.5, cpu_mean=0.9, cpu_p95=0.95)
    outcome = plan(q[:1], busy, [], make_policy("packing"), LIMITS, 0.0)
    assert outcome.placements == []  # measured busier than reserved (an under-declared job): wait
    assert outcome.reasons[0].startswith("held back: host measured 90% busy")
    # --no-host-load: the reservations alone decide, whatever else loads the host.
    unmeasured = plan(q[:1], busy, [], make_policy("packing"), Limits(host_load=False), 0.0)
    assert [p.job_id for p in unmeasured.placements] == [0]
    # Measured busy as reserved: the reservations decide, and the job fits.
    declared = host(cpus_total=2, mem_total=8 * G, jobs=1, cpus_reserved=1, cpu_mean=0.5, cpu_p95=0.95)
    assert len(plan(q[:1], declared, [], make_policy("packing"), LIMITS, 0.0).placements) == 1
    idle = host(cpus_total=2, mem_total=8 * G, jobs=1, cpus_reserved=0.5, cpu_mean=0.2, cpu_p95=0.3)
    assert len(plan(q[:1], idle, [], make_policy("packing"), LIMITS, 0.0).placements) == 1


def test_fits_at_all() -> None:
    h, gs = host(), [gpu(0)]
    assert fits_at_all(job(1, gpu_mem=90), h, gs) is not None
    assert "2 GPU" in fits_at_all(job(1, gpus=2), h, gs)
    assert fits_at_all(job(1, cpus=17), h, gs) is not None
    assert fits_at_all(job(1), h, gs) is None
    # GPU memory with no GPU would run on the CPU, its memory unheeded: refused, saying why.
    assert "no GPU" in fits_at_all(job(1, gpu_mem=1, gpus=0), host(), [])
    assert "--gpus 0" in fits_at_all(job(1, gpu_mem=1, gpus=0), h, gs)
    assert fits_at_all(job(1, gpu_mem=None, gpus=0), host(), []) is None


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="choose one of"):
        make_policy("greedy")


def test_aging_counts_from_when_a_job_could_start() -> None:
    gpus = [gpu(0, jobs=1, mem_reserved=60 * G)]
    retried = job(1, gpu_mem=30, waiting_since=99.0)  # submitted at 1, requeued just now
    got = plan(
        [retried, job(2, gpu_mem=10)],
        host(),
        gpus,
        make_policy("first-fit"),
        Limits(starve_after_s=50),
        100.0,
    ).placements
    assert [p.job_id for p in got] == [2]  # not starved yet: the small job may pass it


def test_a_job_alone_on_the_host_blocks_gpu_jobs_too() -> None:
    lonely = host(alone=True, jobs=1, all_jobs=1)
    assert placed("first-fit", [job(1)], [gpu(0)], h=lonely) == {}
    busy = host(jobs=0, all_jobs=1)  # one GPU job runs: a CPU job that must be alone waits
    q = [waiting(2, 0, 2.0, cpus=1, mem=0, escalation=2)]
    assert plan(q, busy, [], make_policy("first-fit"), LIMITS, 0.0).placements == []


def test_no_probe_on_a_gpu_measured_full() -> None:
    full = [gpu(0, jobs=1, mem_reserved=10 * G, mem_used=80 * G, activity_mean=0.1, activity_p95=0.1)]
    assert placed("first-fit", [job(1, gpu_mem=None)], full) == {}


def test_ram_beyond_what_is_handed_out_is_refused() -> None:
    h = host(mem_total=100 * G)
    big = waiting(1, 0, 0.0, cpus=1, mem=97 * G)
    assert "at most" in fits_at_all(big, h, [])  # 5% of RAM is kept free of jobs


def test_a_share_groups_job_prefers_the_gpu_its_batches_are_on() -> None:
    gpus = [gpu(0), gpu(1, jobs=1, mem_reserved=10 * G), gpu(2)]
    assert placed("most-free-memory", [job(1)], gpus) == {1: (0,)}
    assert placed("most-free-memory", [job(1, prefer_gpus=(1,))], gpus) == {1: (1,)}
    # a preferred GPU that cannot take the job is passed over: the policy's choice stands
    full = [gpu(0), gpu(1, jobs=1, mem_reserved=75 * G)]
    assert placed("most-free-memory", [job(1, prefer_gpus=(1,))], full) == {1: (0,)}


def test_which_share_definitions_keep_batches_on_a_gpu() -> None:
    from tandem.share.spec import ShareSpec

    assert ShareSpec("a", "images", "/d").slab_on_gpu
    assert ShareSpec("a", "dataset", "m:f", device="cuda:0").slab_on_gpu
    assert not ShareSpec("a", "images", "/d", device="cpu").slab_on_gpu
    assert not ShareSpec("a", "dataset", "m:f", batch_size=4).slab_on_gpu


def test_a_share_producers_default_reservation_leaves_room_for_a_job() -> None:
    from tandem.share.spec import ShareSpec

    auto = ShareSpec("a", "dataset", "m:f")
    assert auto.producer_cpus(2) == 1  # a 2-core laptop: one core, one left for jobs
    assert auto.producer_cpus(1) == 0.5
    assert auto.producer_cpus(16) == 4  # a quarter of a server
    assert auto.producer_cpus(128) == 8  # at most 8
    assert ShareSpec("a", "dataset", "m:f", num_workers=3).producer_cpus(16) == 4  # its workers + 1
    assert ShareSpec("a", "dataset", "m:f", num_workers=3).producer_cpus(2) == 1  # ... but room kept
    assert ShareSpec("a", "dataset", "m:f", cpus=1.5).producer_cpus(2) == 1.5  # as defined
    # Loader workers: one per core of the manager (cores are elastic; the producer's weight
    # settles who runs), at most 8; with --cpus, those less one; as defined with --num-workers.
    assert [auto.loader_workers(c) for c in (1, 2, 4, 64)] == [1, 2, 4, 8]
    least = 1 if len(os.sched_getaffinity(0)) >= 2 else 0
    assert ShareSpec("a", "dataset", "m:f", cpus=3).loader_workers(16) == 2
    assert ShareSpec("a", "dataset", "m:f", cpus=1).loader_workers(16) == least
    assert ShareSpec("a", "dataset", "m:f", num_workers=0).loader_workers(16) == 0
    assert ShareSpec("a", "images", "/d", cpus=1).loader_workers(2) == 1


def test_sizing_a_producer_imports_no_torch_into_the_daemon() -> None:
    """The daemon sizes a producer's workers in its loop when the producer starts: with torch
    imported for it, that pass took 1.8 CPU-s and a sweep's jobs waited for it."""
    sized = (
        "import sys, tandem.place.daemon, tandem.place.producers;"
        "from tandem.share.spec import ShareSpec;"
        "[ShareSpec('a', s, 'm:f', cpus=c).loader_workers(2)"
        " for s in ('dataset', 'images') for c in (None, 3)];"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", sized], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_packing_counts_what_jobs_use_beyond_their_declaration() -> None:
    # Two jobs that declared a quarter core each use a whole one (a start-up burst): a
    # 1-core job waits, a quarter-core one still fits; first-fit goes by reservations.
    h = host(cpus_total=2, jobs=2, cpus_reserved=0.5, cpus_over=(1.0, 7))
    one = waiting(1, 0, 1.0, cpus=1, mem=0)
    quarter = waiting(2, 0, 2.0, cpus=0.25, mem=0)
    outcome = plan([one, quarter], h, [], make_policy("packing"), LIMITS, 0.0)
    assert [p.job_id for p in outcome.placements] == [2]
    assert outcome.reasons[1] == (
        "held back: jobs use 1.0 cores more than they declared (job 7 most; a starting job as its program "
        "did at start), 0.5 of 2 cores left"
    )
    assert len(plan([one], h, [], make_policy("first-fit"), LIMITS, 0.0).placements) == 1


def test_under_cpu_weights_jobs_over_their_declaration_give_a_newcomer_its_share() -> None:
    """Two half-core jobs past their start-up that use a core each (CPU-bound, on idle cores):
    under CPU weights the kernel shares the cores out as a newcomer starts, so two more
    half-core jobs start beside them (each gets its half); a job of more than its fair share,
    or one beside a start-up burst, still waits. Without weights, it waits as before."""
    steady = dict(
        cpus_total=2, jobs=2, all_jobs=2, cpus_reserved=1.0, cpus_over=(1.0, 7), cpu_mean=1.0, cpu_p95=1.0
    )
    half = [waiting(i, 0, float(i), cpus=0.5, mem=0) for i in range(2)]
    outcome = plan(half, host(**steady, weighted=True), [], make_policy("packing"), LIMITS, 0.0)
    assert [p.job_id for p in outcome.placements] == [0, 1]  # four half-core jobs at once on 2 cores
    one = [waiting(9, 0, 0.0, cpus=1, mem=0)]
    assert plan(one, host(**steady, weighted=True), [], make_policy("packing"), LIMITS, 0.0).placements == []
    burst = host(**steady, weighted=True, cpus_starting=1.0)
    assert [p.job_id for p in plan(half, burst, [], make_policy("packing"), LIMITS, 0.0).placements] == []
    unweighted = plan(half, host(**steady), [], make_policy("packing"), LIMITS, 0.0)
    assert unweighted.placements == [] and unweighted.reasons[0].startswith("held back: jobs use 1.0 cores")


def test_the_host_is_judged_over_its_last_seconds() -> None:
    from tandem.place.devices import Window

    w = Window(30.0)
    for t in range(20):
        w.add(float(t), 1.0 if t < 3 else 0.1)  # a start-up burst, then quiet
    assert w.mean() == pytest.approx((3 * 1.0 + 17 * 0.1) / 20)
    assert w.mean(5.0) == pytest.approx(0.1) and w.p95(5.0) == pytest.approx(0.1)
    assert w.p95() == pytest.approx(1.0)  # the whole window still holds the burst


def test_jobs_starting_together_count_what_their_program_used_at_start() -> None:
    from tandem.place.active import Startup

    startup = Startup()
    startup.seen(["python", "-m", "train", "--lr", "1"], 1.0)  # an import took a core
    assert startup.cores(["python", "-m", "train", "--lr", "2"]) == 1.0  # the same program
    assert startup.cores(["sleep", "3"]) == 1.0  # never seen: a core while it starts, until measured
    startup.seen(["sleep", "3"], 0.0)
    assert startup.cores(["sleep", "3"]) == 0.0  # its first sample says what it really takes
    # Four quarter-core jobs of that program on two cores: one, then the others as the
    # first one's start-up is over (not all four imports at once).
    q = [waiting(i, 0, float(i), cpus=0.25, mem=0, startup_cpus=1.0) for i in range(4)]
    h = host(cpus_total=2)
    outcome = plan(q, h, [], make_policy("packing"), LIMITS, 0.0)
    assert [p.job_id for p in outcome.placements] == [0, 1]  # 0.5 reserved + 1.5 starting
    assert outcome.reasons[2].startswith("held back: jobs use 1.5 cores more than they declared")
    # Jobs with no start-up to count (GPU jobs: their own GPU checks) start together, as declared.
    fresh = [waiting(i, 0, float(i), cpus=0.5, mem=0) for i in range(4)]
    assert len(plan(fresh, h, [], make_policy("packing"), LIMITS, 0.0).placements) == 4
