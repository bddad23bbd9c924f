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
    assert str(cores) == "cores: needs 2, 1.5 free (0.5 short)"
    assert str(ram) == "RAM: needs 4.0G, 3.0G free (1.0G short)"
    assert str(share) == "GPU compute: needs 50%, 0% free (50% short)"
    assert need.short_of(need) == [] and need.fits_in(need)
    # Over-reserved (free below zero): said as none free, short by all it needs and more.
    assert str(Shortfall("cores", 1.0, -0.5)) == "cores: needs 1, 0 free (1.5 short)"


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
