"""SQLite files handled from outside the write path, by any program's rules: headers,
locks and processes read for doctor (``inspect``), a file read strictly read-only
(``foreign``), copied as of one commit (``backup``), or written as another program
writes it, without our gate (``outside``).  Above the engine, whose keyed connections
(``engine.cipher``), transactions and error translation it uses; it imports apsw
itself (``.importlinter``: never psycopg, nothing of messages)."""
