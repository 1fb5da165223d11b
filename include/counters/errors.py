"""The engine's errors, in a module of their own: the DAG files name them in the tasks' retry
policy, and parsing those must not import the engine (and with it the Cassandra driver)."""

from __future__ import annotations

from collections.abc import Sequence

from .core import CheckOutcome


class EngineError(RuntimeError):
    """A run could not do its work; the message is the one-line reason."""


class LeaseHeld(EngineError):
    pass


class ChecksFailed(EngineError):
    def __init__(self, message: str, outcomes: Sequence[CheckOutcome]):
        super().__init__(message)
        self.outcomes = list(outcomes)


class EpochInFuture(EngineError):
    pass


class ClockSkew(EngineError):
    """This host's clock is too far off the cluster's to compact from it (``clock_refusal``):
    refused before the step wrote or deleted anything; a retry on another host may succeed."""


class ArchiveError(EngineError):
    """A family's archive cannot be written or read as it must be (a bad URL, a store that
    refuses, a file that does not read back): a run deletes nothing it has not archived."""
