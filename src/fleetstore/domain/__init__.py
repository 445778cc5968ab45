"""The domain: operations and their rules (history, state, outbox, blobs, the
frameworks' storage).  It knows no store and no driver: it depends on the
narrow protocol in ``domain/ports.py``."""
