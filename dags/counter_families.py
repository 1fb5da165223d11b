"""Airflow DAGs: one `compact_<family>` DAG per counter family in the families YAML.

The YAML is `$COUNTERS_CONFIG`, else `counter_families.yaml` in Airflow's DAG folder (next to
this file). The DAGs are built by `counters.airflow.factory`; a broken family entry is reported
by `counters_config_check.py`.
"""

from counters.airflow.factory import family_dags

globals().update(family_dags())
