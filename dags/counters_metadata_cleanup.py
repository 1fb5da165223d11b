"""Airflow DAG `counters_metadata_cleanup`: daily, deletes Airflow metadata past its retention."""

from counters.airflow.factory import metadata_cleanup_dags

globals().update(metadata_cleanup_dags())
