"""tandem.select on datasets with a planted truth: ids and indices reproducible across
processes, one stored copy under a race, each method's direction, class balance, the cost
as an MLflow run, and bad input refused with nothing half-written."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tandem.bench.select_data import Blobs, Mixture, mlp, noisy, target_a
from tandem.select import SelectError, load, select
from tandem.select.store import root
from tests.timing import until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TANDEM_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "state"


def _in_a_new_process(state: Path, code: str) -> dict:
    env = dict(os.environ, TANDEM_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


SELECT_IN_A_PROCESS = """
import json, sys
from tandem.select import select
from tandem.bench.select_data import noisy, mlp
s = select(noisy(), "small-loss", {budget}, model=mlp, seed={seed}, track=False)
print(json.dumps({{"id": s.id, "indices": s.indices.tolist(), "cached": s.cached}}))
"""


def test_the_same_inputs_give_the_same_id_and_indices_in_fresh_processes(state: Path, tmp_path: Path) -> None:
    first = _in_a_new_process(state, SELECT_IN_A_PROCESS.format(budget=0.3, seed=0))
    other = tmp_path / "other-state"  # a second store: computed again, not read back
    second = _in_a_new_process(other, SELECT_IN_A_PROCESS.format(budget=0.3, seed=0))
    assert first["id"] == second["id"] and first["indices"] == second["indices"]
    assert not first["cached"] and not second["cached"]
    again = _in_a_new_process(state, SELECT_IN_A_PROCESS.format(budget=0.3, seed=0))
    assert again["cached"] and again["indices"] == first["indices"]
    assert _in_a_new_process(state, SELECT_IN_A_PROCESS.format(budget=0.3, seed=1))["id"] != first["id"]
    assert _in_a_new_process(state, SELECT_IN_A_PROCESS.format(budget=0.2, seed=0))["id"] != first["id"]


def test_racing_processes_leave_exactly_one_stored_copy(state: Path) -> None:
    env = dict(os.environ, TANDEM_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
    code = SELECT_IN_A_PROCESS.format(budget=0.25, seed=3)
    argv = [sys.executable, "-c", code]
    procs = [subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    results = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert len({r["id"] for r in results}) == 1
    assert len({tuple(r["indices"]) for r in results}) == 1
    assert sorted(p.name for p in root().iterdir() if not p.name.startswith(".")) == [results[0]["id"]]


def test_small_loss_keeps_far_less_noise_than_random_and_the_hard_end_keeps_it() -> None:
    ds = noisy()  # half the labels flipped
    kept = {}
    for method in ("random", "small-loss", "el2n", "grand"):
        sel = select(ds, method, 0.3, model=mlp, seed=0, track=False)
        assert len(sel) == 450 and np.all(np.diff(sel.indices) > 0) and sel.indices.dtype == np.int64
        kept[method] = ds.flipped[sel.indices].mean()
    assert 0.4 < kept["random"] < 0.6
    assert kept["small-loss"] < 0.15  # low loss after a warm-up: the clean end
    assert kept["el2n"] > 0.8 and kept["grand"] > 0.8  # keep-hardest: on noisy data, the noise


def test_kcenter_covers_every_cluster_and_less_selects_for_its_target() -> None:
    tight = Blobs(600, 0.0, seed=2, spread=0.05)  # 10 tight clusters
    sel = select(tight, "kcenter", 10, seed=0, balance=False, track=False)
    assert sorted(set(tight.true[sel.indices])) == list(range(10))  # one per cluster
    mix = Mixture()
    random = select(mix, "random", 0.3, seed=0, track=False)
    less = select(mix, "less", 0.3, model=mlp, target=target_a(), seed=0, track=False)
    assert mix.domain_b[random.indices].mean() > 0.35
    assert mix.domain_b[less.indices].mean() < 0.25  # the target is the first domain


def test_class_balance_keeps_each_class_share() -> None:
    ds = Blobs(1000, 0.0, seed=4)
    sel = select(ds, "small-loss", 0.2, model=mlp, seed=0, track=False)
    counts = np.bincount(ds.y[sel.indices], minlength=10)
    expected = np.bincount(ds.y, minlength=10) * 0.2
    assert np.all(np.abs(counts - expected) <= 1)


def test_the_cost_is_an_mlflow_run_and_the_stored_copy_is_verified(state: Path) -> None:
    sel = select(noisy(), "small-loss", 0.3, model=mlp, seed=5)
    cost = sel.meta["cost"]
    assert cost["wall_s"] > 0 and cost["cpu_s"] > 0 and cost["mlflow_run_id"]
    assert "energy_measured_joules" in cost or "energy_estimated_joules" in cost
    db = sqlite3.connect(state / "mlflow.db")

    def status() -> str:
        (status,) = db.execute(
            "SELECT status FROM runs WHERE run_uuid = ?", (cost["mlflow_run_id"],)
        ).fetchone()
        return str(status)

    # The run's writer is niced (10): on a busy machine it may finish after select returns.
    until(lambda: status() != "RUNNING", 120, lambda: f"the run is still {status()}", every=0.5)
    assert status() == "FINISHED"
    again = load(sel.id)
    assert again.cached and np.array_equal(again.indices, sel.indices)
    np.save(sel.path / "indices.npy", sel.indices[:-1])  # tampered with
    with pytest.raises(SelectError, match=f"damaged.*tandem select rm {sel.id}"):
        load(sel.id)


def test_bad_input_is_refused_and_nothing_is_left_half_written() -> None:
    ds = noisy()
    bad = [(0, "keep 1 to 1500"), (0.0, "above 0"), (len(ds) + 1, "keep 1 to"), (-3, "keep 1 to"),
           (True, "a fraction"), ("10%", "a fraction")]  # fmt: skip
    for budget, words in bad:
        with pytest.raises(SelectError, match=words):
            select(ds, "random", budget, track=False)
    with pytest.raises(SelectError, match="unknown method 'lesss'; one of random, small-loss"):
        select(ds, "lesss", 0.3)
    with pytest.raises(SelectError, match="pass model="):
        select(ds, "small-loss", 0.3)
    with pytest.raises(SelectError, match="pass target="):
        select(ds, "less", 0.3, model=mlp)
    unlabelled = [x for x, _ in (ds[i] for i in range(100))]
    with pytest.raises(SelectError, match="needs labels"):
        select(unlabelled, "small-loss", 0.3, model=mlp, track=False)
    import torch

    with pytest.raises(SelectError, match=r"logits of shape \[batch, classes\].*returned \(2, 3\)"):
        select(ds, "small-loss", 0.3, model=lambda: torch.nn.Linear(20, 3), track=False)
    with pytest.raises(SelectError, match="takes no epochs"):
        select(ds, "small-loss", 0.3, model=mlp, params={"epochs": 2}, track=False)
    assert not root().exists() or [p.name for p in root().iterdir() if not p.name.startswith(".")] == []
    sel = select(ds, "random", 0.1, track=False)
    with pytest.raises(SelectError, match="made of another dataset"):
        sel.subset(Blobs(1500, 0.5, seed=99))
    assert len(sel.subset(ds)) == 150
    with pytest.raises(SelectError, match="no selection nope"):
        load("nope")


def test_what_a_review_found_stays_fixed(tmp_path: Path) -> None:
    """Items whose repr changes on every read are refused (not a new id each time); another
    label field is another selection; a numpy budget is stored; a torn use line is skipped."""
    import torch

    class Opaque:
        pass

    with pytest.raises(SelectError, match="cannot fingerprint dataset items holding a Opaque: pass version="):
        select([(Opaque(), 0)] * 10, "random", 5, track=False)
    rows = [{"input": torch.tensor([float(i), 0.0]), "fine": i % 4, "coarse": i % 2} for i in range(40)]
    fine = select(rows, "random", 10, label_key="fine", track=False)
    coarse = select(rows, "random", 10, label_key="coarse", track=False)
    assert fine.id != coarse.id
    assert select(noisy(), "random", np.int64(30), track=False).meta["budget"] == 30
    with pytest.raises(SelectError, match="warmup_epochs 0"):
        select(noisy(), "small-loss", 0.3, model=mlp, params={"warmup_epochs": 0}, track=False)
    with open(fine.path / "uses.jsonl", "a") as f:
        f.write('{"role": "producer", "share": "a"}\n{"role": "prod')  # cut short
    from tandem.select import uses

    assert uses(fine.id) == [{"role": "producer", "share": "a"}]


def test_a_share_spec_refuses_a_select_that_could_never_run() -> None:
    """What ``--select`` may say is select's to check (share knows nothing of its methods)."""
    from tandem.select.for_share import parse_select, select_command
    from tandem.share.spec import ShareSpec, SpecError

    with pytest.raises(SelectError, match="needs a target set"):
        parse_select("less:0.3", model_given=True)
    with pytest.raises(SelectError, match="give --select-model"):
        parse_select("small-loss:0.3", model_given=False)
    with pytest.raises(SelectError, match="METHOD:BUDGET"):
        parse_select("nope:0.3", model_given=True)
    assert parse_select("small-loss:0.3", model_given=True) == ("small-loss", 0.3)
    assert select_command("m:f", "kcenter:50", 3, None)[-6:] == [
        "--method",
        "kcenter",
        "--budget",
        "50",
        "--seed",
        "3",
    ]
    with pytest.raises(SpecError, match="give --dataset, and not --selection"):
        ShareSpec("s", "loader", "m:f", select="small-loss:0.3")
    spec = ShareSpec("s", "dataset", "m:f", select="small-loss:0.3", select_model="models.py:mlp").resolved()
    assert spec.select_model is not None and spec.select_model.startswith("/")  # the producer runs elsewhere


def test_each_method_gets_what_it_declares_it_needs_and_no_name_is_checked() -> None:
    """Every method of the registry, by its declared needs alone: a needed model, target or
    label missing is refused saying what to pass; an optional model changes the selection,
    a model no method asks for is ignored; and the CLI's help says the same."""
    from tandem.cli.select import METHOD_HELP, MODEL_HELP, TARGET_HELP
    from tandem.select import METHODS

    ds = Blobs(300, 0.2, seed=3)
    unlabelled = [ds[i][0] for i in range(len(ds))]
    for name, m in METHODS.items():
        assert m.keep in ("low", "high") and not (m.needs_model and m.model_optional), name
        assert f"{name} ({m.needs})" in METHOD_HELP
        assert (name in MODEL_HELP) == (m.needs_model or m.model_optional)
        assert (name in TARGET_HELP) == m.needs_target
        params = {"warmup_epochs": 1} if "warmup_epochs" in m.defaults else None
        model = mlp if m.needs_model or m.model_optional else None
        target = target_a() if m.needs_target else None
        run = dict(seed=0, params=params, track=False)
        if m.needs_model:
            with pytest.raises(SelectError, match=f"{name} trains a proxy: pass model="):
                select(ds, name, 30, target=target, **run)
        if m.needs_target:
            with pytest.raises(SelectError, match=f"{name} selects for a target: pass target="):
                select(ds, name, 30, model=model, **run)
        if m.needs_labels:
            with pytest.raises(SelectError, match=f"{name} needs labels"):
                select(unlabelled, name, 30, model=model, target=target, **run)
        else:
            assert len(select(unlabelled, name, 30, model=model, target=target, **run)) == 30
        sel = select(ds, name, 30, model=model, target=target, **run)
        assert len(sel) == 30 and sel.meta["keep"] == m.keep
        assert (sel.meta["target"] is not None) == m.needs_target
        if not m.needs_model:
            bare = select(ds, name, 30, target=target, **run)  # runs without a model
            assert bare.meta["model"] is None
            with_model = select(ds, name, 30, model=mlp, target=target, **run)
            assert (with_model.id != bare.id) == m.model_optional  # else the model is ignored
