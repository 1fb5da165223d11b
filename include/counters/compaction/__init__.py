"""Compaction of a family: plan -> compact shards -> verify -> clean up -> finish.

A run is sequenced once, in ``sequence``: each step does its check and writes the run's audit
row where the run ends. ``run_family`` runs every step for ``counterctl compact`` (shards in
parallel processes); the DAG runs the same ``run_steps`` for a small run, and one step of
``RunSteps`` per task for a larger one (compact and cleanup mapped over shards).

A shard is worked a bucket at a time (a token sub-range: one ledger partition, one index
partition, one raw-table scan), so every step costs requests per bucket, not per counter:

1. read the bucket's ledger (checkpoints) and compact copies, then its raw rows (a token-range
   scan when much of it changed, ``IN`` reads of the touched counters when little did);
2. fold each counter (``core.fold_counter``) and commit the bucket's folds in conditional
   batches on the bucket's head: one Paxos round for up to ``COMMIT_CHUNK`` counters, applied
   only if no other commit touched the bucket since it was read;
3. write the readers' compact copies (each with its commit's write timestamp);
4. verify, before anything is deleted: the ledger and the copies read back, and an independent
   server-side recount (``GROUP BY`` over the token range) of the raw rows each commit counted;
   a counter that fails is quarantined (never folded or deleted again until released), the rest
   proceed;
5. cleanup (after the family-level checks passed) deletes exactly the rows each verified
   commit counted, in multi-partition batches of one token range.

Safety does not depend on the shard lease (it only avoids duplicate work).

One module per step: ``plan``, ``fold``, ``shard`` (fold, commit, copy), ``verify``, ``cleanup``,
``conclude``, ``sequence`` (the steps in order, their checks and audit rows), ``pool`` (a whole
run in worker processes); ``reads`` the tolerant reads and the walk over buckets that the
steps share (no step imports another for them); ``common`` holds what else they share.

No names are re-exported here: ``counters.engine`` is the one public surface, and code inside
the package imports from the module that defines a name."""
