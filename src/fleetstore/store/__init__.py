"""The store: the ``Store`` facade, one backend per layout (single file, sharded,
PostgreSQL), the spool and the async facade."""
