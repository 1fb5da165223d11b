"""Airflow DAG-file guard for the families YAML: defines no DAG.

It fails to import, with one error naming every broken family entry, while
`counter_families.py` still loads the good families.
"""

from counters.airflow.factory import check_config

check_config()
