"""Which trials of a sweep to stop early: the one pure decision, from what each logged.

A sweep submitted with ``--prune asha|median --metric NAME:min|max`` (or ``tandem.jobs``'
``prune=``, ``metric=``) is judged here from each trial's reports of NAME to its own MLflow
run (:class:`Report`: its step, value and when it was logged); the daemon reads them
(:mod:`tandem.place.pruning`) and stops what :func:`decide` names. A trial's progress is
the count of distinct steps it reported (step = epoch or iteration, counted from 0 or 1
alike), so ``rung r`` is its r-th report.

``asha``: asynchronous successive halving (Li et al., 2020), with Ray Tune's
``ASHAScheduler``'s defaults and bar: rungs at ``grace * reduction**k`` reports (1, 3, 9, 27,
... by default); a trial that reached a rung stops if its value there is worse than the
``1/reduction`` best quantile (linear interpolation, as numpy's percentile) of the other
trials' values at that rung. Ray compares a trial only with those that reached the rung
before it, which works where its resources stagger the trials; tandem runs a sweep's trials
side by side (one producer feeds them all), so they reach each rung within seconds of each
other and the first ones would go unjudged. So a trial is compared with every trial that
reached the rung, before or after it, for as long as it runs: one let on because it was
first stops once the rung's best share, among all that reached it, leaves it out (as ASHA's
promotions would not have promoted it). A trial alone at a rung goes on.

``median``: the median stopping rule (Optuna's ``MedianPruner``, Golovin et al., 2017): from
``grace`` reports on, a trial stops at the first report worse than the median of the values
the trials before it had at the same report, once at least ``MEDIAN_MIN_BEFORE`` had one.

Decided from the reports alone: a daemon that restarts, or that sees reports late, stops the
running trials that the reports so far leave out, never one they keep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

METHODS = ("asha", "median")
MODES = ("min", "max")
GRACE = 1  # reports before any stop
REDUCTION = 3  # ASHA: a rung keeps the best third
MEDIAN_MIN_BEFORE = 2  # median: the trials before it at a report, at least


@dataclass(frozen=True)
class Rule:
    """How a group's trials are pruned: the method, the metric and which way is better."""

    method: str
    metric: str
    mode: str
    grace: int = GRACE
    reduction: int = REDUCTION

    @classmethod
    def of(cls, method: str, metric: str | None) -> Rule:
        """The rule of ``--prune METHOD --metric NAME:min|max``; ValueError saying what to fix."""
        if method not in METHODS:
            raise ValueError(f"--prune {method}: use one of {', '.join(METHODS)}")
        if not metric:
            raise ValueError(f"--prune {method} needs --metric NAME:min or NAME:max (what each trial logs)")
        name, sep, mode = metric.rpartition(":")
        if not sep or not name or mode not in MODES:
            raise ValueError(f"--metric {metric}: give NAME:min or NAME:max (loss:min, accuracy:max)")
        return cls(method, name, mode)

    def worse(self, value: float, than: float) -> bool:
        return value > than if self.mode == "min" else value < than

    def rungs(self, reports: int) -> list[int]:
        """The rungs a trial with ``reports`` reports has reached, lowest first."""
        if self.method == "median":
            return list(range(self.grace, reports + 1))
        out, rung = [], self.grace
        while rung <= reports:
            out.append(rung)
            rung *= self.reduction
        return out


@dataclass(frozen=True)
class Report:
    """One value a trial logged: its step, the value, and when (MLflow's timestamp, ms)."""

    step: int
    value: float
    at: int


@dataclass(frozen=True)
class Pruned:
    """A trial to stop: where (its rung, the report count), its value there, the bar it
    missed and how many other trials' values at the rung set that bar."""

    trial: int
    rung: int
    value: float
    bar: float
    among: int

    def reason(self, rule: Rule) -> str:
        bar = "median" if rule.method == "median" else f"best 1/{rule.reduction} bar"
        worse = "above" if rule.mode == "min" else "below"
        who = (
            "trial(s) that reached it before" if rule.method == "median" else "other trial(s) that reached it"
        )
        return (
            f"pruned ({rule.method}) at rung {self.rung}: {rule.metric} {self.value:.6g} is {worse} the "
            f"{bar} {self.bar:.6g} of the {self.among} {who}"
        )


def progress(reports: Sequence[Report]) -> list[Report]:
    """A trial's reports, one per step (its last value for a step logged twice), in step order."""
    by_step: dict[int, Report] = {}
    for r in sorted(reports, key=lambda r: (r.step, r.at)):
        if math.isfinite(r.value):
            by_step[r.step] = r
    return [by_step[s] for s in sorted(by_step)]


def _quantile(values: list[float], q: float) -> float:
    """numpy's linear percentile of ``values`` at ``q`` (0..1)."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _bar(rule: Rule, before: list[float]) -> float | None:
    if rule.method == "median":
        return _quantile(before, 0.5) if len(before) >= MEDIAN_MIN_BEFORE else None
    if not before:
        return None
    keep = 1.0 / rule.reduction  # the best third goes on: min keeps the lowest, max the highest
    return _quantile(before, keep if rule.mode == "min" else 1.0 - keep)


def decide(rule: Rule, reports: Mapping[int, Sequence[Report]], running: set[int]) -> list[Pruned]:
    """The trials of ``running`` to stop now, each at the first rung it missed: for ASHA
    judged against every other trial of ``reports`` (the group's, ended or stopped too) that
    reached the rung; for the median rule against those that reached it before it."""
    steps = {trial: progress(rs) for trial, rs in reports.items()}
    stops = []
    for trial in sorted(running):
        mine = steps.get(trial, [])
        for rung in rule.rungs(len(mine)):
            at = mine[rung - 1]
            others = [
                theirs[rung - 1].value
                for other, theirs in steps.items()
                if other != trial
                and len(theirs) >= rung
                and (rule.method == "asha" or (theirs[rung - 1].at, other) < (at.at, trial))
            ]
            bar = _bar(rule, others)
            if bar is not None and rule.worse(at.value, bar):
                stops.append(Pruned(trial, rung, at.value, bar, len(others)))
                break
    return stops
