"""The typed resources (:mod:`tandem.place.resources`): arithmetic, what fits, what is short
and by how much in ``tandem ls``'s words, and a reservation's sources. Pure: milliseconds."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest

from tandem.place.resources import GIVEN, LEARNT, PROBE, Reservation, Resources, Shortfall

G = 1 << 30


def test_add_and_subtract_figure_by_figure() -> None:
    job = Resources(cores=1.5, ram=2 * G, gpus=1, gpu_mem=3 * G, gpu_share=30)
    producer = Resources(cores=2.0, ram=G)
    both = job + producer
    assert both == Resources(cores=3.5, ram=3 * G, gpus=1, gpu_mem=3 * G, gpu_share=30)
    assert both - producer == job
    over = Resources(cores=1.0) - Resources(cores=1.5)  # reserved over what is there: below zero, kept
    assert over.cores == -0.5 and not Resources(cores=0.1).fits_in(over)


def test_fits_in_is_every_figure_at_most_the_free_one() -> None:
    free = Resources(cores=2.0, ram=4 * G, gpus=1, gpu_mem=10 * G, gpu_share=100)
    assert Resources(cores=2.0, ram=4 * G, gpus=1, gpu_mem=10 * G, gpu_share=100).fits_in(free), "equal fits"
    assert Resources(cores=0.5).fits_in(free)
    for too_much in (
        Resources(cores=2.01),
        Resources(ram=4 * G + 1),
        Resources(gpus=2),
        Resources(gpu_mem=11 * G),
        Resources(gpu_share=101),
    ):
        assert not too_much.fits_in(free), too_much


def test_short_of_says_which_figure_and_by_how_much() -> None:
    free = Resources(cores=1.5, ram=3 * G, gpus=1, gpu_mem=8 * G)
    need = Resources(cores=2.0, ram=4 * G, gpus=1, gpu_mem=6 * G, gpu_share=50)
    short = need.short_of(free)
    assert [s.figure for s in short] == ["cores", "ram", "gpu_share"]
    cores, ram, share = short
    assert cores.by == pytest.approx(0.5) and ram.by == G and share.by == 50
    assert str(cores) == "cores: needs 2, 1.5 free"
    assert str(ram) == "RAM: needs 4.0G, 3.0G unreserved"
    assert str(share) == "GPU compute: needs 50%, 0% free"
    assert need.short_of(need) == [] and need.fits_in(need)
    # Of a total, with what the need includes, on whose device: the words of tandem ls.
    total = Resources(cores=2.0, ram=8 * G, gpus=1, gpu_mem=16 * G)
    (cores,) = Resources(cores=2.0).short_of(free, total, suffix=" with its share's producer")
    assert str(cores) == "cores: needs 2 with its share's producer, 1.5 of 2 free"
    (gpu_mem,) = Resources(gpu_mem=10 * G).short_of(free, total, where="GPU 0")
    assert str(gpu_mem) == "GPU 0 memory: needs 10.0G, 8.0G of 16.0G unreserved"
    # Over-reserved (free below zero): said as none free, short by all it needs and more.
    over = Shortfall("cores", 1.0, -0.5)
    assert str(over) == "cores: needs 1, 0 free" and over.by == 1.5


def test_a_figure_that_is_not_a_finite_number_is_refused() -> None:
    for bad in (float("nan"), float("inf"), "2", True, None):
        with pytest.raises(ValueError, match="not a finite number"):
            Resources(cores=bad)  # type: ignore[arg-type]
    with pytest.raises(FrozenInstanceError):
        Resources().cores = 1.0  # type: ignore[misc]


def test_a_reservation_says_where_each_figure_came_from() -> None:
    r = Reservation(Resources(cores=0.5, ram=G, gpus=1, gpu_mem=2 * G), PROBE, LEARNT, GIVEN)
    assert str(r) == "0.5 cores (probe), 1.0G RAM (learnt), 1 GPU(s) with 2.0G each (given)"
    with_producer = r.with_producer(Resources(cores=2.0, ram=0))
    assert with_producer.resources == Resources(cores=2.5, ram=G, gpus=1, gpu_mem=2 * G)
    assert (with_producer.cores_from, with_producer.ram_from) == ("probe+share", "learnt"), (
        "only the figures the producer adds to say so"
    )
    assert with_producer.with_producer(Resources(cores=1.0)).cores_from == "probe+share"
    with pytest.raises(ValueError, match="cores_from: 'guessed'"):
        Reservation(Resources(), cores_from="guessed")


def test_a_reservation_follows_what_is_measured_and_reads_back_as_written() -> None:
    probe = Reservation(Resources(0.25, 0, 1, 0), PROBE, PROBE, PROBE, cores_why="probe", ram_why="auto")
    assert probe.probe and probe.gpu_probe and probe.gpu_mem is None, "GPU memory not known yet"
    learnt = probe.measured(cores=0.9, ram=G, why="measured, this run").measured(gpu_mem=2 * G, why="")
    assert learnt.resources == Resources(0.9, G, 1, 2 * G)
    assert (learnt.cores_from, learnt.ram_from, learnt.gpu_mem_from) == (LEARNT, LEARNT, LEARNT)
    assert learnt.cores_why == learnt.ram_why == "measured, this run" and learnt.gpu_mem == 2 * G
    assert not learnt.probe and not learnt.gpu_probe
    assert Reservation.from_dict(learnt.to_dict()) == learnt
    shared = learnt.with_producer(Resources(cores=1.0))
    assert shared.with_share and not learnt.with_share
