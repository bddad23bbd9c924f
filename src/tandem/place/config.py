"""The daemon's configuration: one typed record, kept in the state directory.

``tandem daemon start`` writes it (``daemon-config.json``) before it starts the daemon, and
every daemon of that state directory reads it: one restarted by ``tandem submit`` after a
crash runs with the cores, RAM, policy and limits it was given, not with the defaults.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.place.fairshare import UserLimits
from tandem.place.paths import CONFIG_FILE
from tandem.place.policies import DEFAULT_POLICY, Limits
from tandem.place.resources import Cap

DEFAULT_LOG_MAX = 64 << 20  # bytes of a job's output kept on disk (the last part kept on rotation)


@dataclass(frozen=True)
class DaemonConfig:
    # The cores and RAM to hand out (--cpus, --mem; None: all this process may use).
    cap: Cap = field(default_factory=Cap)
    gpus: str | None = None  # "0,2", UUIDs, "none" (None: all)
    policy: str = DEFAULT_POLICY
    limits: Limits = field(default_factory=Limits)
    grace_s: float = 10.0  # between SIGTERM and SIGKILL
    # A share's producer serves on this long after its group's last job: a tuner that
    # submits its next trials as the last ones end (Optuna's ask-and-tell) finds it serving.
    producer_linger_s: float = 15.0
    interval_s: float = 1.0  # between a job's samples
    mps: bool = False
    track: bool = True
    store: str | None = None  # MLflow tracking URI (None: $MLFLOW_TRACKING_URI, else the state dir's)
    backend: str = "local"  # or "ray"
    address: str | None = None  # the Ray cluster (None: start one)
    log_max: int = DEFAULT_LOG_MAX
    # A system manager (tandem daemon start --system): every user of the host submits to it,
    # each job runs as its submitter; its socket (``socket``) is open to all of them.
    system: bool = False
    socket: str | None = None  # where it listens (None: the state directory's own, private)
    admin_gid: int | None = None  # a group whose members may act on any job (as root may)
    # What one user's running jobs may hold (--max-jobs-per-user, --max-cores-per-user,
    # --max-gpu-mem-per-user; None: no limit).
    user_limits: UserLimits = field(default_factory=UserLimits)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DaemonConfig:
        known, values = {f.name for f in dataclasses.fields(cls)}, dict(values)
        if isinstance(values.get("cap"), dict):
            values["cap"] = Cap(**{k: v for k, v in values["cap"].items() if k in ("cores", "ram")})
        elif "cpus" in values or "mem" in values:  # kept before the cap was one value
            values["cap"] = Cap(values.pop("cpus", None), values.pop("mem", None))
        if isinstance(values.get("limits"), dict):
            lim = {f.name for f in dataclasses.fields(Limits)}
            values["limits"] = Limits(**{k: v for k, v in values["limits"].items() if k in lim})
        if isinstance(values.get("user_limits"), dict):
            per_user = {f.name for f in dataclasses.fields(UserLimits)}
            values["user_limits"] = UserLimits(
                **{k: v for k, v in values["user_limits"].items() if k in per_user}
            )
        return cls(**{k: v for k, v in values.items() if k in known})

    def save(self, state_dir: Path) -> None:
        path = state_dir / CONFIG_FILE
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)

    @classmethod
    def load(cls, state_dir: Path) -> DaemonConfig:
        """The kept configuration; the defaults where none was kept (or it cannot be read)."""
        try:
            return cls.from_dict(json.loads((state_dir / CONFIG_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return cls()
