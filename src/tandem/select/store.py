"""Stored selections: content-addressed, written once, verified when read.

``<state dir>/selections/<id>/`` holds ``indices.npy`` (sorted int64), ``scores.npy``,
``meta.json`` (what it was made of and what it cost) and ``checksums.json`` (an HMAC-SHA-256
of each of the three, keyed with the state directory's own secret, ``selections/.key``,
0600: a selection planted by anyone who cannot read the key is refused, not served).
A selection is written whole into a temporary directory beside it, then renamed into place
under a lock: of two processes that make the same selection at once, one renames and the
other finds it there and removes its own copy, so exactly one stays.
``uses.jsonl`` beside them grows by a line whenever a job or producer loads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from tandem.dirs import state_dir
from tandem.select.errors import SelectError

FILES = ("indices.npy", "scores.npy", "meta.json")


def root() -> Path:
    """The selections' directory in the private state directory (a state directory that may
    not be used is :class:`tandem.dirs.StateDirError`, as for every command)."""
    base = state_dir() / "selections"
    base.mkdir(mode=0o700, exist_ok=True)
    return base


def _key(make: bool = True) -> bytes:
    """This state directory's secret for the selections' checksums, made once (0600) by a
    writer; a reader (``make=False``) only reads it: none there is a ValueError (nothing
    stored here was keyed with it)."""
    path = root() / ".key"
    if not make:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise ValueError(
                f"{path} is missing: no selection was written with this state directory's key"
            ) from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path.read_bytes()


@dataclass
class Selection:
    """A stored selection: ``indices`` into its dataset (sorted), every item's ``scores``,
    and ``meta`` (inputs, fingerprints, cost, lineage); ``cached``: found, not computed."""

    id: str
    indices: np.ndarray
    scores: np.ndarray
    meta: dict[str, Any]
    cached: bool = False
    path: Path = field(default_factory=Path)

    def __len__(self) -> int:
        return int(self.indices.size)

    def check(self, dataset: Any) -> None:
        """Refuse a dataset that is not the one this selection was made of."""
        from tandem.select.data import fingerprint

        want = self.meta["dataset"]
        got = fingerprint(dataset, want.get("version"), want.get("how", "sampled"))  # as it was made
        if got != want["fingerprint"]:
            raise SelectError(
                f"selection {self.id} was made of another dataset (fingerprint {want['fingerprint']}, "
                f"this one {got}: {len(dataset)} items against {want['length']}); make a new selection for it"
            )

    def subset(self, dataset: Any) -> Any:
        """``dataset`` restricted to the selected items (checked to be its dataset)."""
        import torch

        self.check(dataset)
        return torch.utils.data.Subset(dataset, self.indices.tolist())


def selection_id(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _mac(key: bytes, path: Path) -> str:
    return hmac.new(key, path.read_bytes(), hashlib.sha256).hexdigest()


def save(sel_id: str, indices: np.ndarray, scores: np.ndarray, meta: dict[str, Any]) -> Selection:
    """Store a selection once; if another process stored it first, that copy is returned."""
    base = root()
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sel_id}-", dir=base))
    try:
        np.save(tmp / "indices.npy", indices.astype(np.int64))
        np.save(tmp / "scores.npy", scores.astype(np.float64))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        key = _key()
        (tmp / "checksums.json").write_text(
            json.dumps({"hmac-sha256": {f: _mac(key, tmp / f) for f in FILES}})
        )
        for f in (*FILES, "checksums.json"):
            os.chmod(tmp / f, 0o600)
        with FileLock(str(base / f".{sel_id}.lock"), timeout=60, mode=0o600):
            final = base / sel_id
            if final.exists():
                shutil.rmtree(tmp)
                return load(sel_id, cached=True)
            os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return load(sel_id, cached=False)


def exists(sel_id: str) -> bool:
    return (root() / sel_id / "checksums.json").exists()


def _dir(sel_id: str) -> Path:
    """The directory of stored selection ``sel_id`` (:class:`SelectError` if there is none)."""
    path = root() / sel_id
    if not sel_id or "/" in sel_id or sel_id.startswith(".") or not path.is_dir():
        raise SelectError(f"no selection {sel_id} in {root()} (tandem select ls lists them)")
    return path


def load(sel_id: str, cached: bool = True) -> Selection:
    """The stored selection ``sel_id``, its files verified."""
    path = _dir(sel_id)
    try:
        sums = json.loads((path / "checksums.json").read_text())
        macs = sums.get("hmac-sha256") if isinstance(sums, dict) else None
        if not isinstance(macs, dict):
            raise ValueError("checksums.json is not this tandem's (no keyed checksums in it)")
        key = _key(make=False)  # a reader: it makes no secret
        bad = [f for f in FILES if not hmac.compare_digest(_mac(key, path / f), str(macs.get(f, "")))]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} changed since it was written, or it was not written with this state "
                "directory's key"
            )
        meta = json.loads((path / "meta.json").read_text())
        indices = np.load(path / "indices.npy", allow_pickle=False)
        scores = np.load(path / "scores.npy", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SelectError(
            f"selection {sel_id} in {path} is damaged ({exc}): remove it (tandem select rm {sel_id}) "
            "and make it again"
        ) from None
    return Selection(sel_id, indices, scores, meta, cached, path)


def record_use(sel: Selection, who: dict[str, Any]) -> None:
    """Note that a job or producer used the selection (best effort: a read-only store is fine)."""
    try:
        with open(sel.path / "uses.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), **who}) + "\n")
    except OSError:
        pass


def uses(sel_id: str) -> list[dict[str, Any]]:
    try:
        lines = (root() / sel_id / "uses.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut short (a crash or a full disk mid-append): skipped
            continue
    return [u for u in out if isinstance(u, dict)]


def ids() -> list[str]:
    base = root()
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))


def remove(sel_id: str) -> None:
    shutil.rmtree(_dir(sel_id))
