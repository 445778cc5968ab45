"""Write an ADK session database the way ADK itself does, for the importer tests
(tests/integrations/test_adk.py).  Run as its own process: it uses SQLite through the standard
library (SQLAlchemy/aiosqlite), which must never share a process with fleetstore's
connections (DESIGN.md, "Two SQLite libraries in one process").

    adk_make_db.py PATH --kind database|sqlite-service|garbage|v0 [--tweak]

``database`` uses ``DatabaseSessionService`` (the v1 schema), ``sqlite-service``
``SqliteSessionService``.  Event ids are fixed, so two runs write the same events;
``--tweak`` changes the text of one of them.  Prints a JSON manifest of what was
written: per session its state (as ADK's get_session returns it) and event ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
from typing import Any

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.genai import types


def events_for(app: str, user: str, sid: str, tweak: bool) -> list[Event]:
    out = []
    for i in range(4):
        text = f"{app}/{user}/{sid} says {i}"
        if tweak and i == 2:
            text += " (edited)"
        out.append(
            Event(
                id=f"ev-{app}-{user}-{sid}-{i}",
                author="user" if i % 2 == 0 else "helper",
                invocation_id=f"inv-{i // 2}",
                timestamp=1_700_000_000.0 + i,
                content=types.Content(
                    role="user" if i % 2 == 0 else "model", parts=[types.Part(text=text)]
                ),
                actions=EventActions(state_delta={"step": i, f"user:last_{sid}": i, "app:n": i}),
            )
        )
    call = types.FunctionCall(name="lookup", args={"q": sid}, id=f"call-{sid}")
    response = types.FunctionResponse(
        name="lookup", id=f"call-{sid}", response={"out": "x" * 70_000}
    )
    out.append(
        Event(
            id=f"ev-{app}-{user}-{sid}-call",
            author="helper",
            invocation_id="inv-9",
            timestamp=1_700_000_010.0,
            content=types.Content(role="model", parts=[types.Part(function_call=call)]),
        )
    )
    out.append(
        Event(
            id=f"ev-{app}-{user}-{sid}-response",
            author="helper",
            invocation_id="inv-9",
            timestamp=1_700_000_011.0,
            content=types.Content(role="user", parts=[types.Part(function_response=response)]),
        )
    )
    return out


async def write(path: str, kind: str, tweak: bool) -> dict[str, Any]:
    service: Any
    if kind == "database":
        from google.adk.sessions import DatabaseSessionService

        service = DatabaseSessionService(f"sqlite+aiosqlite:///{path}")
    else:
        from google.adk.sessions.sqlite_session_service import SqliteSessionService

        service = SqliteSessionService(path)
    manifest: dict[str, Any] = {"sessions": []}
    for app, user, sid in (("app1", "ann", "s1"), ("app1", "bob", "s2"), ("app2", "ann", "s3")):
        session = await service.create_session(
            app_name=app,
            user_id=user,
            session_id=sid,
            state={"topic": sid, "app:owner": "ops", "user:lang": "en", "temp:x": 1},
        )
        for event in events_for(app, user, sid, tweak):
            await service.append_event(session, event)
        stored = await service.get_session(app_name=app, user_id=user, session_id=sid)
        manifest["sessions"].append(
            {
                "app": app,
                "user": user,
                "id": sid,
                "state": stored.state,
                "events": [e.id for e in stored.events],
                "texts": [
                    e.content.parts[0].text if e.content and e.content.parts else None
                    for e in stored.events
                ],
            }
        )
    await service.close()
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(prog="adk_make_db")
    parser.add_argument("path")
    parser.add_argument("--kind", required=True)
    parser.add_argument("--tweak", action="store_true")
    args = parser.parse_args()
    if args.kind == "garbage":
        with open(args.path, "wb") as f:
            f.write(b"this is no database\n" * 100)
        print("{}")
        return 0
    if args.kind == "v0":
        conn = sqlite3.connect(args.path)
        conn.executescript(
            "CREATE TABLE sessions (app_name, user_id, id, state, create_time, update_time);"
            "CREATE TABLE events (id, app_name, user_id, session_id, invocation_id, author,"
            " timestamp, content, actions BLOB);"
            "CREATE TABLE app_states (app_name, state, update_time);"
            "CREATE TABLE user_states (app_name, user_id, state, update_time);"
        )
        conn.close()
        print("{}")
        return 0
    print(json.dumps(asyncio.run(write(args.path, args.kind, args.tweak))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
