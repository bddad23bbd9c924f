"""The overview's cards on a Ray cluster: one per node, alive (its jobs, the cores and RAM
reserved on it against what it has, what Ray holds, what its agent measured) or gone, drawn by the page's own
``cards`` from the ``nodes`` of ``tandem daemon status --json`` (the daemon's own reply
type, as :mod:`tandem.place.requests` fills it). Run under Node with the stand-in document
of :mod:`tests.web.test_group_page_text`; skipped where there is no ``node``."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest

from tandem.place import protocol as p
from tandem.place.resources import Resources
from tests.web.test_group_page_text import HARNESS, NODE, SCRIPTS

GiB = 1 << 30


def _status() -> dict:
    nodes = [
        p.NodeUse(
            "a1",
            "head",
            True,
            Resources(2.0, 4 * GiB),
            Resources(1.5, GiB),
            1.0,
            3,
            [1],
            Resources(0.5, 2 * GiB),
        ),
        p.NodeUse("b2", "worker", False, Resources(), Resources(), 0.0, 0, []),
        p.NodeUse(
            "c3", "late", True, Resources(2.0, 4 * GiB), Resources(), 0.0, 0, []
        ),  # its agent not heard yet
    ]
    status = p.DaemonStatus(
        pid=1, policy="packing", state_dir="/s", started=0.0, limits={}, mps=False, backend="ray",
        tracking=None, jobs={}, nodes=nodes,
        capacity=p.CapacityReport(Resources(2.0, 4 * GiB), [p.GpuCapacity(1, "a1:0", 16 * GiB)]),
        used=p.Use(Resources(1.5, GiB), None, 3, [p.GpuUse(1, 1, 0, None, None, False)]),
    )  # fmt: skip
    return dataclasses.asdict(status)


@pytest.mark.skipif(NODE is None, reason="no node")
def test_a_card_per_node_alive_or_gone(tmp_path: Path) -> None:
    script = HARNESS[: HARNESS.index("const wait = () =>")] + (
        "process.stdout.write(vm.runInContext('cards', context)(group, null).textContent);\n"
    )
    harness = tmp_path / "cards.js"
    harness.write_text(script)
    argv = [NODE or "node", str(harness), json.dumps([str(s) for s in SCRIPTS]), json.dumps(_status())]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "node head cores 1.5 / 2 reserved (1.0 held in Ray)" in text, text
    assert "RAM 1.0 GiB / 4.0 GiB reserved busy 1.5 cores · 2.0 GiB free · 3 running · GPUs 1" in text, text
    assert "node late cores 0.0 / 2 reserved" in text and "not measured · 0 running" in text, text
    assert "node worker gone: its jobs run elsewhere" in text, text
    for word in ("null", "undefined", "NaN", "[object"):
        assert word not in text, (word, text)
