"""Finding and loading tracked runs for ``tandem report``: by MLflow run id, run name,
``group:NAME``, ``job:ID`` (a job manager's job: every attempt) or a file-store run directory.

Lookups may span several stores (``tandem report`` looks in ``./mlflow.db`` or
``$MLFLOW_TRACKING_URI`` and in the job manager's store): a group's or a job's runs are
gathered from every store, a run id or name is taken from the first store that has it, so
one store never hides another's runs.

Lookups are read-only: they never create a store (MLflow would create a 1 MB database for a
mistyped path), and a file-store directory needs no MLflow at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tandem.watch.stores.base import default_store_uri
from tandem.watch.stores.csv_file import read_points
from tandem.watch.stores.mlflow_store import sqlite_path
from tandem.watch.stores.runs_reader import RunsReader, StoredRun, open_reader

GROUP_TAG = "group"
SHARE_TAG = "tandem.share"  # a job manager run's shared dataset
ROLE_TAG = "tandem.role"  # "producer": the run of a share's producer
JOB_TAG = "tandem.job_id"  # a job manager run's job
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class RunNotFound(LookupError):
    pass


@dataclass
class RunData:
    run_id: str
    name: str
    start_ms: int
    tags: dict[str, str] = field(default_factory=dict)
    status: str = ""
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # key -> [(ms, value)]
    summary: dict[str, float] = field(default_factory=dict)

    @property
    def group(self) -> str | None:
        return self.tags.get(GROUP_TAG)


# --- loading ------------------------------------------------------------------------------
def _reader(uri: str | None) -> RunsReader:
    """The reader of an existing store: a lookup must not create one (MLflow would, 1 MB)."""
    uri = uri or default_store_uri()
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise RunNotFound(
            f"no MLflow store found: looked for {db} (and the job manager's store in its state "
            "directory); give --store URI or set MLFLOW_TRACKING_URI, or run this where the runs' "
            "mlflow.db is"
        )
    try:
        return open_reader(uri)
    except ImportError:
        raise RunNotFound(
            "looking runs up by name, id or group in this store needs MLflow (pip install mlflow); "
            "run directories of `tandem run --sink csv|parquet` need none"
        ) from None


def _readers(uris: Sequence[str]) -> list[tuple[str, RunsReader]]:
    """(uri, reader) of each of ``uris`` that exists, in order, each once; RunNotFound naming
    where it looked if none does."""
    uris = list(dict.fromkeys(uris))
    missing = [db for u in uris if (db := sqlite_path(u)) is not None and not db.is_file()]
    if len(missing) == len(uris):
        looked = " and ".join(str(db) for db in missing)
        raise RunNotFound(
            f"no MLflow store found: looked for {looked}; give --store URI or set "
            "MLFLOW_TRACKING_URI, or run this where the runs' mlflow.db is"
        )
    return [(u, _reader(u)) for u in uris if (db := sqlite_path(u)) is None or db.is_file()]


def recent_runs(uri: str | None = None, limit: int = 10) -> list[tuple[str, str, str]]:
    """(run id, name, group) of the newest runs in the store, newest first."""
    reader = _reader(uri)
    try:
        return [(r.run_id, r.name, r.tags.get(GROUP_TAG, "")) for r in reader.recent(limit)]
    finally:
        reader.close()


def _not_found(ref: str, uris: Sequence[str]) -> RunNotFound:
    recent: list[tuple[str, str, str]] = []
    for uri in uris:
        try:
            recent = recent_runs(uri)
        except Exception:
            continue
        if recent:
            break
    where = " nor in ".join(uris)
    if not recent:
        return RunNotFound(f"no run {ref!r} in {where}, which has no runs yet (track one with `tandem run`)")
    lines = "\n".join(f"  {rid}  {name}" + (f"  (group {g})" if g else "") for rid, name, g in recent)
    return RunNotFound(f"no run {ref!r} in {where}. Recent runs:\n{lines}")


def _loaded(reader: RunsReader, run: StoredRun, keys: Sequence[str] | None = None) -> RunData:
    data = RunData(run.run_id, run.name, run.start_ms, dict(run.tags), run.status)
    for key, value in run.metrics.items():
        if key.startswith("summary/"):
            data.summary[key.removeprefix("summary/")] = value
        elif keys is None or any(re.fullmatch(k, key) for k in keys):
            data.series[key] = reader.history(run.run_id, key)
    return data


def _from_dir(path: Path) -> RunData:
    meta = json.loads((path / "run.json").read_text())
    data = RunData(
        meta["run_id"],
        meta.get("name", path.name),
        int(meta.get("start_time_ms", 0)),
        dict(meta.get("tags", {})),
        meta.get("status", ""),
    )
    for p in read_points(path / "metrics.csv"):
        if p.key.startswith("summary/"):
            data.summary[p.key.removeprefix("summary/")] = p.value
        else:
            data.series.setdefault(p.key, []).append((p.timestamp_ms, p.value))
    return data


def _producers_of(reader: RunsReader, runs: list[StoredRun], group: str) -> list[StoredRun]:
    """The runs of the shared producers that fed ``runs`` (job manager runs tagged
    ``tandem.share``): the group's work includes its loading, so its figures count them.
    Those that ran within the group's span, shown in its column."""
    shares = {r.tags.get(SHARE_TAG) for r in runs} - {None, ""}
    if not shares or not runs:
        return []
    start = min(r.start_ms for r in runs)
    end = max(r.end_ms or r.start_ms for r in runs)
    have = {r.run_id for r in runs}
    out = []
    for share in sorted(s for s in shares if s):
        for r in reader.tagged({ROLE_TAG: "producer", SHARE_TAG: share}):
            ends = r.end_ms or end
            if r.run_id not in have and r.start_ms <= end and ends >= start:
                r.tags[GROUP_TAG] = group  # counted in the group it fed
                out.append(r)
    return out


def _lookup(reader: RunsReader, ref: str) -> list[StoredRun]:
    """The runs of one store that ``ref`` names (a group's with the producers that fed it)."""
    if ref.startswith("group:"):
        group = ref.removeprefix("group:")
        found = reader.tagged({GROUP_TAG: group})
        return found + _producers_of(reader, found, group)
    if ref.startswith("job:"):
        return reader.tagged({JOB_TAG: str(int(ref.removeprefix("job:")))})
    if _RUN_ID.match(ref):
        return [run] if (run := reader.get(ref)) is not None else []
    return [run] if (run := reader.named(ref)) is not None else []


def load_runs(
    refs: Sequence[str], uri: str | None = None, keys: Sequence[str] | None = None, also: Sequence[str] = ()
) -> list[RunData]:
    """Resolve each reference to runs (see the module docstring); unknown ones raise RunNotFound.

    ``uri``: the store (default: ``$MLFLOW_TRACKING_URI``, else ``./mlflow.db``); ``also``:
    further stores (``tandem report`` adds the job manager's). A store that does not exist
    is passed over; RunNotFound if none exists."""
    for ref in refs:  # said before any store is opened (opening one may import MLflow: seconds)
        if ref.startswith("job:") and not ref.removeprefix("job:").isdigit():
            raise RunNotFound(f"{ref!r}: a job is named by its number, as `tandem ls` shows it (job:12)")
    out: list[RunData] = []
    readers: list[tuple[str, RunsReader]] = []
    try:
        for ref in refs:
            path = Path(ref)
            # A file-store run's directory, or the --out directory that holds them.
            inside = sorted(m.parent for m in path.glob("*/run.json"))
            run_dirs = [path] if (path / "run.json").is_file() else inside
            if path.is_dir() and run_dirs:
                out.extend(_from_dir(d) for d in run_dirs)
                continue
            if not readers:
                readers = _readers([uri or default_store_uri(), *also])
            gather = ref.startswith(("group:", "job:"))  # from every store; an id or a name: the first
            found: list[tuple[RunsReader, StoredRun]] = []
            for _, reader in readers:
                runs = _lookup(reader, ref)
                found += [(reader, r) for r in runs]
                if runs and not gather:
                    break
            if not found:
                raise _not_found(ref, [u for u, _ in readers])
            if gather and len(readers) > 1:
                found.sort(key=lambda rr: rr[1].start_ms)
            out.extend(_loaded(reader, r, keys) for reader, r in found)
    finally:
        for _, reader in readers:
            reader.close()
    seen: set[str] = set()
    return [r for r in out if not (r.run_id in seen or seen.add(r.run_id))]  # type: ignore[func-returns-value]
