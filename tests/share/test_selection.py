"""A producer that serves a stored data selection (tandem.select), handed to it as the
selection's items (share never imports tandem.select): its consumers see exactly the
selected items, once an epoch, reshuffled; a selection of another dataset, one that does not
exist, an id where items are wanted and items outside the dataset are refused with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.select import SelectError, select
from tandem.select.for_share import served
from tandem.select.store import uses
from tandem.share import Producer, ShareError

from .workers import RangeDataset, consume, serve_selected, serve_selected_by

N = 103


def test_three_consumers_each_see_exactly_the_selected_items_once_per_epoch(
    procs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TANDEM_STATE_DIR", str(tmp_path / "state"))  # the children's too
    sel = select(RangeDataset(N), "random", 40, input_key="x", label_key="i", balance=False, track=False)
    procs.start(serve_selected, "picked", N, sel.id, 8, None)  # until stopped: each joins when it can
    for tag in ("a", "b", "c"):
        procs.start(consume, "picked", procs.queue, epochs=2, tag=tag)
    res = procs.collect(["a", "b", "c"])
    chosen = sel.indices.tolist()
    for tag in ("a", "b", "c"):
        for epoch in (0, 1):
            ids, _ = res[tag][epoch]
            assert sorted(ids) == chosen, "every selected item exactly once, and nothing else"
    assert res["a"][0][0] != res["a"][1][0], "reshuffled between epochs"
    assert [u["role"] for u in uses(sel.id)] == ["producer"] and uses(sel.id)[0]["share"] == "picked"


def test_a_selection_of_another_dataset_or_none_at_all_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TANDEM_STATE_DIR", str(tmp_path / "state"))
    sel = select(RangeDataset(N), "random", 10, input_key="x", label_key="i", balance=False, track=False)
    with pytest.raises(ShareError, match="made of another dataset"):
        Producer.from_dataset(RangeDataset(N + 1), "other", selection=sel)
    with pytest.raises(SelectError, match="no selection 0123456789abcdef"):
        served("0123456789abcdef", "none")
    with pytest.raises(TypeError, match="give the items, not an id"):
        Producer.from_dataset(RangeDataset(N), "an-id", selection=sel.id)
    with pytest.raises(ShareError, match=f"item {N} is not in the dataset"):
        Producer.from_dataset(RangeDataset(N), "outside", selection=[0, N])


def test_plain_indices_or_a_function_of_the_dataset_select_the_items(procs) -> None:
    procs.start(serve_selected_by, "by-list", N, [5, 7, 11], 2, 1)
    procs.start(consume, "by-list", procs.queue, epochs=1, tag="a")
    assert sorted(procs.collect(["a"])["a"][0][0]) == [5, 7, 11]
    procs.start(serve_selected_by, "by-fn", N, "last-two", 2, 1)
    procs.start(consume, "by-fn", procs.queue, epochs=1, tag="b")
    assert sorted(procs.collect(["b"])["b"][0][0]) == [N - 2, N - 1]
