"""The entry point of every child process of ``fleetstore stress``:
``python -m fleetstore.admin.stress.child --agent|--worker|--verify CONFIG_JSON``
(one agent, one outbox worker, or the set-up or read-back of one target)."""

from __future__ import annotations

import json
import sys
from typing import Any

from fleetstore.admin.stress.agent import _Fleetstore, _Target, agent_main, worker_main


def make_target(cfg: dict[str, Any], agent: int) -> _Target:
    if cfg["target"] == "fleetstore":
        return _Fleetstore(cfg, agent)
    from fleetstore.admin.stress.peers import TARGETS

    return TARGETS[cfg["target"]](cfg, agent)


def prepare(cfg: dict[str, Any]) -> None:
    """Create the target's schema once, before the agents start."""
    if cfg["target"] == "fleetstore":
        import fleetstore

        fleetstore.open(cfg["url"], **cfg["settings"]).close()
    else:
        from fleetstore.admin.stress.peers import prepare as prepare_peer

        prepare_peer(cfg)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("--agent", "--worker", "--verify"):
        print(
            "usage: python -m fleetstore.admin.stress.child --agent|--worker|--verify CONFIG_JSON",
            file=sys.stderr,
        )
        return 2
    cfg: dict[str, Any] = json.loads(argv[1])
    if argv[0] == "--agent":
        return agent_main(cfg, make_target)
    if argv[0] == "--worker":
        return worker_main(cfg)
    if cfg.get("prepare"):
        prepare(cfg)
        print(json.dumps({"prepared": True}))
        return 0
    from fleetstore.admin.stress.verify import verify_main

    print(json.dumps(verify_main(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
