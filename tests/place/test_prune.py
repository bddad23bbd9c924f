"""The pruning decision (:mod:`tandem.place.prune`), pure: ASHA's rungs and bars as Ray
Tune's ``ASHAScheduler`` sets them, the median rule, and decisions that do not depend on
when or how often they are made."""

from __future__ import annotations

import numpy as np
import pytest

from tandem.place.prune import Report, Rule, decide, progress


def reports(values: list[float], start_ms: int, every_ms: int = 1000, first_step: int = 0) -> list[Report]:
    return [Report(first_step + i, v, start_ms + i * every_ms) for i, v in enumerate(values)]


ASHA = Rule.of("asha", "loss:min")


def test_the_rule_of_the_options_and_what_is_wrong_with_bad_ones() -> None:
    assert Rule("asha", "loss", "min", 1, 3) == ASHA
    assert Rule.of("median", "val/acc:max").metric == "val/acc"
    for method, metric, said in [
        ("hyperband", "loss:min", "use one of asha, median"),
        ("asha", None, "needs --metric NAME:min or NAME:max"),
        ("asha", "loss", "give NAME:min or NAME:max"),
        ("asha", "loss:lowest", "give NAME:min or NAME:max"),
    ]:
        with pytest.raises(ValueError, match=said):
            Rule.of(method, metric)


def test_asha_rungs_are_grace_times_powers_of_the_reduction() -> None:
    assert (
        ASHA.rungs(0) == []
        and ASHA.rungs(1) == [1]
        and ASHA.rungs(9) == [1, 3, 9]
        and ASHA.rungs(26) == [1, 3, 9]
    )
    assert Rule("median", "m", "min", grace=2).rungs(4) == [2, 3, 4]


def test_a_trial_alone_at_a_rung_goes_on_and_the_worse_of_two_stops_in_either_order() -> None:
    assert decide(ASHA, {1: reports([5.0], 0)}, {1}) == []
    trials = {1: reports([5.0], 0), 2: reports([9.0], 10)}
    (stop,) = decide(ASHA, trials, {1, 2})
    assert (stop.trial, stop.rung, stop.value, stop.bar, stop.among) == (2, 1, 9.0, 5.0, 1)
    assert "rung 1" in stop.reason(ASHA) and "loss 9 is above" in stop.reason(ASHA)
    assert "of the 1 other trial(s) that reached it" in stop.reason(ASHA)
    # Reached in the other order: the worse one, first there, stops once the better one comes
    # (side by side, "before it" would have let it on); the better one is never stopped.
    assert [
        (s.trial, s.rung) for s in decide(ASHA, {1: reports([5.0], 10), 2: reports([9.0], 0)}, {1, 2})
    ] == [(2, 1)]


def test_trials_side_by_side_keep_a_rungs_best_third_whoever_reached_it_first() -> None:
    """Nine trials that reach each rung within a second of each other, the worst first: Ray's
    rule (only those before it) would keep every one; here each rung keeps its best third."""
    losses = [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    trials = {t: reports([v, v, v], t * 100) for t, v in enumerate(losses)}
    stopped = {s.trial: s.rung for s in decide(ASHA, trials, set(trials))}
    assert set(trials) - set(stopped) == {6, 7, 8}, stopped  # the best three go on
    assert set(stopped.values()) == {1}


def test_the_bar_is_ray_tunes_percentile_of_those_before() -> None:
    """Ray's ``_Bracket.cutoff``: ``np.nanpercentile(rewards, (1 - 1/rf) * 100)`` of the
    rewards (the loss negated for min); a trial below it stops."""
    rng = np.random.default_rng(7)
    before = list(rng.uniform(0, 10, size=8))
    trials = {i: reports([v], i) for i, v in enumerate(before)}
    cutoff = -np.percentile([-v for v in before], (1 - 1 / 3) * 100)  # as a loss
    assert [s.trial for s in decide(ASHA, {**trials, 99: reports([cutoff + 1e-6], 100)}, {99})] == [99]
    assert decide(ASHA, {**trials, 98: reports([cutoff - 1e-6], 100)}, {98}) == []
    maxed = Rule.of("asha", "acc:max")
    cutoff = np.percentile(before, (1 - 1 / 3) * 100)
    assert [s.trial for s in decide(maxed, {**trials, 99: reports([cutoff - 1e-6], 100)}, {99})] == [99]
    assert decide(maxed, {**trials, 98: reports([cutoff + 1e-6], 100)}, {98}) == []


def test_a_trial_is_judged_at_each_rung_and_stops_at_the_first_it_misses() -> None:
    # Trial 1 leads throughout; trial 2 is as good at rung 1 but worse at rung 3.
    trials = {1: reports([5, 4, 3, 2], 0), 2: reports([5, 4.5, 4.2], 100)}
    (stop,) = decide(ASHA, trials, {2})
    assert (stop.rung, stop.value, stop.bar) == (3, 4.2, 3)


def test_a_late_decision_stops_what_the_reports_so_far_leave_out_never_what_they_keep() -> None:
    """A daemon that sees the reports late (or again, after a restart) stops the running trials
    the reports leave out; one that saw them as they came stopped those too, perhaps earlier
    (with fewer to compare)."""
    rng = np.random.default_rng(3)
    trials = {
        t: [Report(s, float(rng.uniform(0, 10)), int(1000 * s + rng.integers(0, 900))) for s in range(9)]
        for t in range(9)
    }
    late = {s.trial for s in decide(ASHA, trials, set(trials))}
    seen: dict[int, int] = {}
    for upto in range(1, 10):  # each second, what was logged so far
        now = {t: [r for r in rs if r.at < 1000 * upto] for t, rs in trials.items()}
        for s in decide(ASHA, now, set(trials) - set(seen)):
            seen[s.trial] = s.rung
    assert late <= set(seen) and len(late) >= 4


def test_steps_from_zero_or_one_and_a_step_logged_twice() -> None:
    assert [r.step for r in progress(reports([1, 2, 3], 0, first_step=1))] == [1, 2, 3]
    twice = [Report(0, 5.0, 0), Report(0, 4.0, 5), Report(1, float("nan"), 9), Report(1, 3.0, 10)]
    assert [(r.step, r.value) for r in progress(twice)] == [(0, 4.0), (1, 3.0)]
    a, b = reports([5.0], 0, first_step=0), reports([9.0], 10, first_step=1)
    assert [s.trial for s in decide(ASHA, {1: a, 2: b}, {1, 2})] == [2]


def test_the_median_rule_waits_for_two_before_and_stops_below_their_median() -> None:
    median = Rule.of("median", "loss:min")
    trials = {1: reports([5, 4, 3], 0), 2: reports([6, 5, 4], 10), 3: reports([5.5, 6, 6], 20)}
    (stop,) = decide(median, trials, {1, 2, 3})
    # Trial 2 had only one before it at each report; trial 3's second is above 4 and 5's median.
    assert (stop.trial, stop.rung, stop.bar) == (3, 2, 4.5)


def test_an_ended_trial_sets_the_bar_and_only_running_ones_are_stopped() -> None:
    trials = {1: reports([1.0, 1.0, 1.0], 0), 2: reports([9.0], 10)}
    assert [s.trial for s in decide(ASHA, trials, {2})] == [2]
    assert decide(ASHA, trials, set()) == []
