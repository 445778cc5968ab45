"""The Agents SDK's ``EncryptedSession`` whose pop authenticates before it removes.

The SDK's ``EncryptedSession.pop_item`` authenticates the item inside the removal
only for its own ``SQLiteSession`` (an ``isinstance`` check); over any other
session it pops first and unwraps after, so an item it cannot authenticate (another
key, a corrupt envelope) is removed and lost.  This subclass does over a
``FleetstoreSession`` what the SDK does over SQLite: the item is authenticated
before fleetstore's conditional removal, and one that fails stays where it was::

    from fleetstore.integrations.openai_agents import FleetstoreSession
    from fleetstore.integrations.openai_agents.encrypted import EncryptedSession

    session = EncryptedSession("user-42", FleetstoreSession("user-42", store), key)

It also hands ``FleetstoreSession``'s whole-history replacement on to the SDK's
compaction when it wraps this class (``OpenAIResponsesCompactionSession(
EncryptedSession(FleetstoreSession(...)))``): the SDK looks that hook up on the
type of the session it wraps, so over the SDK's own class a manual compaction
clears the session and adds the summary in two writes.  Here it is one
transaction, refused if the session changed since the compaction read it.
Everything else is the SDK's class (it needs ``cryptography``: the SDK's
``encrypt`` extra).
"""

from __future__ import annotations

from typing import Any

from fleetstore.core.extras import requires
from fleetstore.integrations.openai_agents.adapter import FleetstoreSession

with requires("openai-agents", "fleetstore's OpenAI Agents SDK support"):
    from agents.extensions.memory.encrypt_session import EncryptedSession as _SdkEncryptedSession
    from agents.extensions.memory.encrypt_session import _is_encrypted_envelope
    from agents.items import TResponseInputItem
    from agents.run_context import RunContextWrapper


class EncryptedSession(_SdkEncryptedSession):
    """``agents.extensions.memory.EncryptedSession``; over a ``FleetstoreSession``
    its ``pop_item`` authenticates the last item before removing it (an
    ``InvalidToken`` leaves it in place), as the SDK's does over ``SQLiteSession``."""

    async def pop_item(
        self, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> TResponseInputItem | None:
        underlying = self.underlying_session
        if (
            not isinstance(underlying, FleetstoreSession)
            or getattr(type(underlying), "pop_item", None) is not FleetstoreSession.pop_item
        ):
            # As the SDK: a subclass that overrides pop_item keeps its own pop.
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

    async def _read_compaction_items(
        self, limit: int | None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> tuple[list[TResponseInputItem], bool]:
        underlying = self.underlying_session
        if isinstance(underlying, FleetstoreSession):
            # Noted before the read: an item stored in between makes the replacement
            # refuse (it sees a message it was not told of), never lose it.
            await underlying._note_compaction_basis()
        return await super()._read_compaction_items(limit, wrapper=wrapper)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        underlying = self.underlying_session
        if not isinstance(underlying, FleetstoreSession):
            return False  # the SDK's own path
        return await underlying._atomic_replace_items(self._encrypt_items(items))


__all__ = ["EncryptedSession"]
