"""Airflow DAG `counters_freshness`: alerts when a family's compacted epoch falls behind."""

from counters.airflow.factory import freshness_dags

globals().update(freshness_dags())
