"""Compaction of event-sourced counters in Cassandra (seed 004's garbage collection, made exact)."""
