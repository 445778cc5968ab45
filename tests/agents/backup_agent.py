"""A writer of the backup fleet test (tests/admin/test_backup.py):

    python tests/agents/backup_agent.py STORE AGENT LOG STOP

Until the file STOP exists it writes sessions of a few messages through
``fleetstore.open(STORE)``: a user message, then tool outputs, every third one a blob
(100-300 KB of random bytes, its own every time), now and then a subagent, and now and
then it deletes one of its older sessions (whose blobs a collection may then take).
After each acknowledged call it appends one JSON line to LOG (one ``os.write``):
``{"ack": "message", "sid", "root", "mid", "seq", "sha", "at"}`` with the SHA-256 of
what the message holds, or ``{"ack": "delete", "sid", "at"}`` (its subagents go with
it); ``at`` is ``time.time()`` once the call returned.  It prints ``ready`` after its
first READY messages (default 10).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time

import fleetstore


def content_sha(message: fleetstore.Message) -> str:
    """What a message holds, hashed: the same on both sides of a backup."""
    digest = hashlib.sha256(message.role.encode())
    for part in message.parts:
        body = getattr(part, "text", None)
        if body is None:
            body = getattr(part, "output", b"")
        digest.update(part.kind.encode())
        digest.update(body.encode() if isinstance(body, str) else body)
    return digest.hexdigest()


def main(store_path: str, agent: int, log_path: str, stop: str, ready: int = 10) -> None:
    rng = random.Random(agent)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def ack(**record: object) -> None:
        os.write(log, (json.dumps({**record, "at": time.time()}) + "\n").encode())

    written = 0
    mine: list[str] = []
    with fleetstore.open(store_path) as store:
        while not os.path.exists(stop):
            parent = rng.choice(mine) if mine and rng.random() < 0.2 else None
            sid = store.sessions.create(title=f"agent {agent}", parent_id=parent).id
            if parent is None:
                mine.append(sid)
            for turn in range(rng.randint(2, 5)):
                if turn == 0:
                    parts: list[fleetstore.Part] = [fleetstore.Text(f"task {written}")]
                    role = "user"
                else:
                    size = rng.randint(100_000, 300_000) if written % 3 == 0 else 200
                    output = rng.randbytes(size)
                    parts = [fleetstore.ToolResult(f"c{written}", output, name="bash")]
                    role = "tool"
                m = store.messages.append(sid, role, parts)
                root = parent or sid
                ack(ack="message", sid=sid, root=root, mid=m.id, seq=m.seq, sha=content_sha(m))
                written += 1
                if written == ready:
                    print("ready", flush=True)
            if len(mine) > 4 and rng.random() < 0.3:
                gone = mine.pop(rng.randrange(len(mine) - 2))
                store.sessions.delete(gone)
                ack(ack="delete", sid=gone)
    os.close(log)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], *map(int, sys.argv[5:]))
