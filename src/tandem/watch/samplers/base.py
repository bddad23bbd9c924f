"""What a sampler is: the small interface the tracker's sampling loop calls.

A sampler reads one source of figures. ``available()`` says whether it works here:
``(True, "")``, ``(True, note)`` in a reduced mode (estimated energy, say) or
``(False, why)``, so a sampler says clearly why it cannot work on this machine instead of
failing. ``sample()`` returns metric names (under ``system/``, unit in the name) mapped to
values; ``tags()`` what to store once as tags (GPU UUIDs); ``close()`` frees what it holds.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Sampler(Protocol):
    name: str

    def available(self) -> tuple[bool, str]: ...
    def sample(self) -> dict[str, float]: ...

    # Defaults for samplers that subclass this protocol explicitly: no tags, nothing to free.
    def tags(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        return None
