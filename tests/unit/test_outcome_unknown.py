"""Which write errors leave a commit's outcome open (settled by a serial read of the head) and
which mean it was not applied (the run fails and deletes nothing)."""

from __future__ import annotations

import pytest
from cassandra import OperationTimedOut, ReadTimeout, Unavailable, WriteTimeout
from cassandra.policies import WriteType
from cassandra.protocol import ErrorMessage, ServerError
from counters.store import CAS_WRITE_UNKNOWN, outcome_unknown

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("error", "unknown"),
    [
        (WriteTimeout("paxos", write_type=WriteType.CAS), True),
        (OperationTimedOut("client"), True),
        (ErrorMessage(CAS_WRITE_UNKNOWN, "CAS operation result is unknown", None), True),
        (WriteTimeout("batch log", write_type=WriteType.BATCH_LOG), False),
        (WriteTimeout("plain", write_type=WriteType.SIMPLE), False),
        (ReadTimeout("read"), False),
        (Unavailable("down"), False),
        (ServerError(0x0000, "boom", None), False),
        (ValueError("not the driver's"), False),
    ],
)
def test_only_timeouts_of_a_conditional_write_leave_its_outcome_open(error, unknown):
    assert outcome_unknown(error) is unknown
