"""Example Airflow DAG `counters_example_after_trades`: scheduled on a family's compact table.

It runs after each run of `compact_trades` that committed something (the table's Asset, see
`counters.airflow.assets`); `COUNTERS_EXAMPLE_FAMILY` picks another family. Without that family
in the families YAML this file defines no DAG.
"""

from counters.airflow.factory import example_dags

globals().update(example_dags())
