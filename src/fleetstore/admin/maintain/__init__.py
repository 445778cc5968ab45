"""``fleetstore maintain``: retention, applied_ops pruning, blob garbage collection,
``PRAGMA optimize``, incremental vacuum and a checkpoint, on a store that a fleet
keeps writing; on a sharded store, then the removal of empty shard files.

One module per step, as River's ``internal/maintenance/``; import from them:

``run``
    ``maintain``: opening, a fleetstore store or a foreign database, the dry run,
    the sharded path, and the order of the steps.
``config``, ``report``
    what a run is asked (``Config``, ages) and what it did (``Step``, ``Report``,
    their text and JSON).
``writer``
    ``Writer`` and ``Batch``: the short, measured transactions every step writes in.
``files``, ``journals``
    a store's database files; what its spool journals hold.
``retention``
    the ``archive`` step (with the archive read back whole) and the ``delete`` step.
``applied_ops``
    the ``ops`` step: pruning of the exactly-once log.
``blobs``
    the ``blobs`` step: garbage collection, and its race with writers.
``vacuum``, ``checkpoint``, ``generic``
    the ``optimize``, ``vacuum`` and ``checkpoint`` steps, and their run on one file
    or on every file of a sharded store.
``shards``
    the ``shards`` step: the removal of empty shard files.

The ``fleetstore maintain`` command is ``fleetstore.cli.maintain``.
"""
