# The image `astro dev start` and `astro deploy` build (README "Deploy"; not built on the machine
# this project is developed on, which runs no Docker engine).
#
# Astro Runtime 3.3-8 carries Apache Airflow 3.3.2, the Airflow this project is tested with (the
# pin in requirements-dev.txt). The Python 3.12 variant: the runtime's default Python is 3.14,
# which apache-airflow-providers-apache-cassandra 3.10.1 does not support (Requires-Python
# >=3.11,!=3.14.*). The deploy test builds its venv with python3.12 where the machine has it.
#
# The runtime's ONBUILD steps install packages.txt (apt) and requirements.txt (pip/uv), then copy
# this folder to /usr/local/airflow. Then the project is installed as the package
# `counters-compaction` (its dependencies are requirements.txt's, already installed): the DAG
# files import it, Airflow loads its plugin from the `airflow.plugins` entry point, and
# `counterctl` is on the PATH.
FROM astrocrpublic.azurecr.io/runtime:3.3-8-python-3.12

RUN pip install --no-cache-dir --no-deps /usr/local/airflow

# Great Expectations: never phone home (it does not today; keep it explicit).
ENV GX_ANALYTICS_ENABLED=false
