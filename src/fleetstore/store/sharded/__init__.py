"""The sharded layout: a catalog plus one SQLite file per session tree.  ``shards``
knows the files and their keys, ``router`` which rows go to which file."""
