"""Engine variants: proposed changes to ``counters.store``/``counters.engine``, applied by the
bench worker as patches so they can be measured end to end against the unchanged engine in the
same bench run (``--variants``), before anyone edits the engine.

Each variant is the code of the proposed diff (the report shows it as a diff); keep them small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def verify_light() -> None:
    """``verify_run`` reads the compact rows without their ``pending`` list (the commit checks
    compare commit id, value and epoch only): ``read_checkpoints(..., pending=False)``."""
    from . import engine
    from . import store as store_module
    from .core import Checkpoint

    original = store_module.Store.read_checkpoints

    def read_checkpoints(self: Any, counters: Sequence[Any], pending: bool = True) -> Any:
        if pending:
            return original(self, counters)
        rows = self._rows_by_partition(
            "compact_read_light", "{value}, {epoch}, commit_id", "{compact}", counters
        )
        out = {}
        for counter in counters:
            found = rows[counter]
            if not found:
                out[counter] = Checkpoint(value=0, epoch=None)
            else:
                value, epoch, commit_id = found[0][:3]
                out[counter] = Checkpoint(value=value or 0, epoch=epoch, commit_id=commit_id)
        return out

    store_module.Store.read_checkpoints = read_checkpoints
    collect = engine.collect_records

    def collect_records(store: Any, run_id: str, shards: Sequence[int]) -> Any:
        light = _LightStore(store)
        return collect(light, run_id, shards)

    engine.collect_records = collect_records


class _LightStore:
    """Delegates to a Store; ``read_checkpoints`` skips ``pending`` (used by verify only)."""

    def __init__(self, store: Any):
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read_checkpoints(self, counters: Sequence[Any]) -> Any:
        return self._store.read_checkpoints(counters, pending=False)


VARIANTS: dict[str, Callable[[], None] | None] = {
    "baseline": None,
    "verify_light": verify_light,
}


def apply(name: str) -> None:
    if name not in VARIANTS:
        raise SystemExit(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    patch = VARIANTS[name]
    if patch is not None:
        patch()
