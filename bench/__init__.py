"""The benchmark: the project's compaction against the scan floor and the naive seed
algorithm on the same data, plus idle-heavy, read latency, limits, per-kind lines and DAG parse
time. Not part of the shipped ``counters`` package; it talks to the engine through its public
functions only. ``python -m bench --help``."""
