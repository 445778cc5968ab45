"""The Agents SDK's ``EncryptedSession`` whose pop authenticates before it removes.

The SDK's ``EncryptedSession.pop_item`` authenticates the item inside the removal
only for its own ``SQLiteSession`` (an ``isinstance`` check); over any other
session it pops first and unwraps after, so an item it cannot authenticate (another
key, a corrupt envelope) is removed and lost.  This subclass does over a
``FleetstoreSession`` what the SDK does over SQLite: the item is authenticated
before fleetstore's conditional removal, and one that fails stays where it was::

    from fleetstore.integrations.openai_agents import FleetstoreSession
    from fleetstore.integrations.openai_agents_encrypted import EncryptedSession

    session = EncryptedSession("user-42", FleetstoreSession("user-42", store), key)

Everything else is the SDK's class (it needs ``cryptography``: the SDK's
``encrypt`` extra).  Compaction needs nothing of this module: the SDK's own
``EncryptedSession`` finds ``FleetstoreSession``'s compaction hooks itself.
"""

from __future__ import annotations

from typing import Any

from agents.extensions.memory.encrypt_session import EncryptedSession as _SdkEncryptedSession
from agents.extensions.memory.encrypt_session import _is_encrypted_envelope
from agents.items import TResponseInputItem
from agents.run_context import RunContextWrapper

from fleetstore.integrations.openai_agents import FleetstoreSession


class EncryptedSession(_SdkEncryptedSession):
    """``agents.extensions.memory.EncryptedSession``; over a ``FleetstoreSession``
    its ``pop_item`` authenticates the last item before removing it (an
    ``InvalidToken`` leaves it in place), as the SDK's does over ``SQLiteSession``."""

    async def pop_item(
        self, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> TResponseInputItem | None:
        underlying = self.underlying_session
        if not isinstance(underlying, FleetstoreSession):
            return await super().pop_item(wrapper=wrapper)

        def authenticate(item: TResponseInputItem) -> None:
            if _is_encrypted_envelope(item):
                # Without the TTL, as the SDK: authenticated expired items still drain.
                self.cipher.extract_timestamp(item["payload"].encode("utf-8"))

        while True:
            enc = await underlying._pop_item_with_validation(authenticate)
            if not enc:
                return None
            item = self._unwrap(enc)
            if item is not None:
                return item


__all__ = ["EncryptedSession"]
