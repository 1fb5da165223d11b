"""A counter that no commit can carry, in a family's DAG: quarantined, the rest compacted, and
the run alerts naming the limit (``dag.test()``: real tasks, real Cassandra, real receivers)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from counters import engine
from counters.client import CounterClient, Increment
from counters.compaction import fold as fold_module
from counters.core import utc_aware
from counters.store import Store

from .test_compaction_dag import alert_channels, load, mail_text, raw_times, states

pytestmark = [pytest.mark.integration, pytest.mark.airflow]


def test_a_counter_too_large_to_fold_is_quarantined_and_the_run_alerts_naming_the_limit(
    conn, make_families, dagbag, receivers, t0, monkeypatch
):
    """IBM's rows of one millisecond are more than one commit carries (the engine's limit
    lowered to 4 KiB of keys here, so a few rows are enough: the real one, against the node's
    16 MiB, is ``engine/test_limits.py``). IBM is quarantined (``too_large``), AAPL is compacted,
    and the run's alert (mail, Slack, webhook) names the counter and the node's limit."""
    monkeypatch.setattr(fold_module, "FOLD_KEY_BYTES", 4096)
    families = make_families({"alerts": alert_channels(receivers)}, shape="mapped")
    family = families.family(families.entries[0]["name"])
    store = Store(conn, family)
    client = CounterClient(conn, family, store)
    load(client, t0, counters=("AAPL",))
    at = t0 + timedelta(minutes=3)
    client.record([Increment(("IBM",), 1, utc_aware(at), ("x" * 500, v)) for v in range(20)])
    epoch = t0 + timedelta(minutes=10)
    run = dagbag().dags[family.dag_id].test(logical_date=utc_aware(epoch + family.lag))

    assert run.state == "failed"
    assert states(run)["record_audit"] == "failed"
    assert client.read("AAPL") == 255 and [t for t in raw_times(store, "AAPL") if t <= epoch] == []
    assert client.read("IBM") == 20 and len(raw_times(store, "IBM")) == 20  # kept, still read
    assert [(q.counter, q.reason) for q in engine.quarantined(store)] == [(("IBM",), "too_large")]
    assert store.audit.page(5)[0]["outcome"] == "partial"
    hooks = receivers.json_posts("/hook")
    assert len(hooks) == 1 and len(receivers.mails) == 1
    for body in ("; ".join(hooks[0]["counters"]), mail_text(receivers.mails[0])):
        assert "IBM: the 20 row(s) of its millisecond" in body
        assert "native_transport_max_message_size" in body
