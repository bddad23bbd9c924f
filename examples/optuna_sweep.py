"""An Optuna study whose trials are tandem jobs reading one shared dataset.

    tandem share define blobs --dataset examples/optuna_sweep.py:train_set --batch-size 64 --shuffle
    python examples/optuna_sweep.py --trials 8 --parallel 4

Optuna's ask-and-tell interface runs trials anywhere: each trial's objective runs as a job
(``tandem.jobs.call``) that reads its batches from the ``blobs`` share, so the data is
loaded once for the whole study; the study is told each job's result as it ends. Any other
tuner works the same way; without Optuna, ``--random`` runs a plain random search.
Needs ``pip install optuna`` (not a tandem dependency).
"""

from __future__ import annotations

import argparse
import math
import random

import torch

import tandem.jobs

GROUP = "optuna-blobs"  # the jobs of a study; a random search's are in "random-blobs"
RANDOM_GROUP = "random-blobs"


class Blobs(torch.utils.data.Dataset):
    """Two Gaussian blobs in 8 dimensions: a small, deterministic classification task."""

    def __init__(self, n: int = 2048):
        g = torch.Generator().manual_seed(0)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x = torch.randn(n, 8, generator=g) + (self.y[:, None] * 2 - 1) * 0.8

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def train_set() -> Blobs:
    return Blobs()


def objective(lr: float, weight_decay: float, epochs: int = 3) -> float:
    """One trial, run as a job: logistic regression on the shared blobs; the last epoch's
    mean loss (lower is better)."""
    from tandem.share import Consumer

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay)
    with Consumer.from_env(batch_size=64) as batches:
        for _ in range(epochs):
            total = count = 0.0
            for x, y in batches:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss) * len(y)
                count += len(y)
    return total / count


def run_optuna(trials: int, parallel: int, share: str) -> tuple[float, dict]:
    import optuna

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=0))
    running: list[tuple[optuna.trial.Trial, tandem.jobs.Job]] = []
    asked = 0
    while asked < trials or running:
        while asked < trials and len(running) < parallel:
            trial = study.ask()
            lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)
            wd = trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True)
            job = tandem.jobs.call(
                objective, lr, wd, cpus=0.25, share=share, group=GROUP, params={"lr": lr, "weight_decay": wd}
            )
            running.append((trial, job))
            asked += 1
        trial, job = running.pop(0)
        try:
            study.tell(trial, job.result())
        except tandem.jobs.JobFailed as exc:
            print(f"trial {trial.number} (job {job.id}) failed: {exc}")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return study.best_value, study.best_params


def run_random(trials: int, share: str) -> tuple[float, dict]:
    rng = random.Random(0)
    points = [
        {"lr": 10 ** rng.uniform(-3, 0), "weight_decay": 10 ** rng.uniform(-6, -2)} for _ in range(trials)
    ]
    jobs = [
        tandem.jobs.call(
            objective, p["lr"], p["weight_decay"], cpus=0.25, share=share, group=RANDOM_GROUP, params=p
        )
        for p in points
    ]
    results = [(j.result(), p) for j, p in zip(jobs, points)]
    best = min(results, key=lambda r: r[0] if math.isfinite(r[0]) else math.inf)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--share", default="blobs")
    parser.add_argument("--random", action="store_true", help="a plain random search, without Optuna")
    args = parser.parse_args()
    value, params = (
        run_random(args.trials, args.share)
        if args.random
        else run_optuna(args.trials, args.parallel, args.share)
    )
    group = RANDOM_GROUP if args.random else GROUP
    print(f"best loss {value:.4f} with {params}; all trials: tandem report group:{group}")


if __name__ == "__main__":
    main()
