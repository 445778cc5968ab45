"""What the spool journals beside a store hold: the blobs their operations refer to
(kept by blob garbage collection) and the time of their oldest operation (which
bounds applied_ops pruning and the removal of empty shard files)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from fleetstore import errors
from fleetstore.core.keys import Keyring
from fleetstore.domain.blobs import referenced_shas
from fleetstore.store.spool import journals, read_journal


@dataclass(slots=True)
class Journals:
    """What the spool journals beside a store hold, for GC and pruning."""

    count: int = 0
    blobs: set[str] = field(default_factory=set)
    #: The creation time of the oldest operation found (None: none found).
    oldest_op: float | None = None
    #: Why the journals cannot be trusted to be read whole ("" if they can).
    doubt: str = ""


def _uuid7_time(op_id: str) -> float | None:
    try:
        value = uuid.UUID(op_id)
    except ValueError:
        return None
    if value.version != 7:
        return None
    return (value.int >> 80) / 1000.0


def read_journals(spool_dir: Path, keyring: Keyring | None = None) -> Journals:
    result = Journals()
    for path in journals(spool_dir):
        try:
            read = read_journal(path, keyring)
        except FileNotFoundError:
            continue  # drained and deleted meanwhile: its operations were applied
        except (OSError, errors.KeyMissing, errors.WrongKey) as exc:
            # (A journal sealed under a key not given: what it refers to is unknown.)
            result.doubt = f"{path.name}: {exc}"
            continue
        result.count += 1
        if read.damaged:
            result.doubt = f"{path.name} is damaged ({read.reason}): what follows is unknown"
        for op in read.ops:
            result.blobs.update(referenced_shas(op.args))
            created = _uuid7_time(op.op_id)
            if created is None:
                result.doubt = result.doubt or f"{path.name}: operation id {op.op_id} has no time"
                continue
            result.oldest_op = (
                created if result.oldest_op is None else min(result.oldest_op, created)
            )
    return result


__all__ = ["Journals", "read_journals"]
