"""``tandem select`` as a user runs it: run (then the stored copy), ls, show, report, rm,
and bad input as exit 2 with what was wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tandem(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TANDEM_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "tandem.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=180)  # fmt: skip


def test_run_ls_show_report_rm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    args = ["select", "run", "--dataset", "tandem.bench.select_data:noisy", "--method", "small-loss",
            "--budget", "0.3", "--model", "tandem.bench.select_data:mlp"]  # fmt: skip
    first = tandem(state, *args, "--json")
    assert first.returncode == 0, first.stderr
    made = json.loads(first.stdout)
    assert made["size"] == 450 and not made["cached"] and made["cost"]["mlflow_run_id"]
    again = tandem(state, *args)
    assert again.returncode == 0 and again.stdout.strip() == made["id"] and "not scored again" in again.stderr
    listed = json.loads(tandem(state, "select", "ls", "--json").stdout)
    assert [s["id"] for s in listed] == [made["id"]]
    shown = json.loads(tandem(state, "select", "show", made["id"], "--json").stdout)
    assert shown["method"] == "small-loss" and shown["keep"] == "low" and shown["uses"] == []
    report = json.loads(tandem(state, "select", "report", made["id"], "--json").stdout)
    assert report["jobs"] == [] and report["break_even"]["wall_s"]["selection"] == made["cost"]["wall_s"]
    assert tandem(state, "select", "rm", made["id"], "nope").returncode == 2  # one unknown: nothing removed
    assert json.loads(tandem(state, "select", "rm", made["id"], "--json").stdout) == {"removed": [made["id"]]}
    assert json.loads(tandem(state, "select", "ls", "--json").stdout) == []


def test_bad_input_exits_2_saying_what_was_wrong(tmp_path: Path) -> None:
    state = tmp_path / "state"
    base = ["select", "run", "--dataset", "tandem.bench.select_data:noisy", "--budget", "0.3"]
    r = tandem(state, *base, "--method", "lesss")
    assert r.returncode == 2 and "unknown method 'lesss'" in r.stderr
    r = tandem(
        state,
        "select",
        "run",
        "--dataset",
        "tandem.bench.select_data:nope",
        "--method",
        "random",
        "--budget",
        "5",
    )
    assert r.returncode == 2 and "has no attribute 'nope'" in r.stderr
    r = tandem(state, *base[:-1], "0", "--method", "random")
    assert r.returncode == 2 and "above 0" in r.stderr
    r = tandem(state, "select", "show", "0123456789abcdef")
    assert r.returncode == 2 and "no selection 0123456789abcdef" in r.stderr
    r = tandem(
        state,
        "share",
        "define",
        "picked",
        "--dataset",
        "tandem.bench.select_data:noisy",
        "--selection",
        "feed",
    )
    assert r.returncode == 2 and "--selection: no selection feed" in r.stderr


def _select(state: Path, budget: str) -> str:
    args = [
        "select",
        "run",
        "--dataset",
        "tandem.bench.select_data:noisy",
        "--method",
        "random",
        "--budget",
        budget,
    ]
    r = tandem(state, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_damaged_or_planted_selection_hides_no_other_and_is_refused(tmp_path: Path) -> None:
    """``select ls`` lists every good selection and marks a damaged one; using a damaged
    one, or one planted with checksums made without this state directory's key, is a
    one-line error (exit 2), never a traceback."""
    import hashlib

    state = tmp_path / "state"
    good, damaged, planted = _select(state, "0.2"), _select(state, "0.3"), _select(state, "0.4")
    (state / "selections" / damaged / "checksums.json").write_text("[]")
    folder = state / "selections" / planted
    (folder / "indices.npy").write_bytes((state / "selections" / good / "indices.npy").read_bytes())
    sums = {
        f: hashlib.sha256((folder / f).read_bytes()).hexdigest()
        for f in ("indices.npy", "scores.npy", "meta.json")
    }
    (folder / "checksums.json").write_text(json.dumps(sums))  # what an older, unkeyed store wrote
    r = tandem(state, "select", "ls", "--json")
    assert r.returncode == 0, r.stderr
    listed = {s["id"]: s for s in json.loads(r.stdout)}
    assert set(listed) == {good, damaged, planted}
    assert "damaged" not in listed[good] and listed[good]["method"] == "random"
    assert "damaged" in listed[damaged] and "damaged" in listed[planted]
    assert "DAMAGED" in tandem(state, "select", "ls").stdout
    for sel_id in (damaged, planted):
        shown = tandem(state, "select", "show", sel_id)
        assert shown.returncode == 2 and "Traceback" not in shown.stderr and "make it again" in shown.stderr


def test_a_selection_a_share_reads_survives_select_rm(tmp_path: Path) -> None:
    from tests.place.conftest import TANDEM

    state = tmp_path / "state"
    runtime = Path(f"/tmp/tt-{os.getpid()}-{tmp_path.name[-12:]}")
    sel = _select(state, "0.3")
    env = dict(os.environ, TANDEM_STATE_DIR=str(state), TANDEM_RUNTIME_DIR=str(runtime), PYTHONPATH=str(ROOT))
    try:
        define = [
            "share",
            "define",
            "picked",
            "--dataset",
            "tandem.bench.select_data:noisy",
            "--selection",
            sel,
        ]
        r = subprocess.run([*TANDEM, *define], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        refused = tandem(state, "select", "rm", sel)
        assert refused.returncode == 2 and "share(s) picked" in refused.stderr and "--force" in refused.stderr
        assert sel in [s["id"] for s in json.loads(tandem(state, "select", "ls", "--json").stdout)]
        assert tandem(state, "select", "rm", sel, "--force").returncode == 0
    finally:
        subprocess.run([*TANDEM, "daemon", "stop"], env=env, capture_output=True, timeout=60)
