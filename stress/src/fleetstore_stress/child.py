"""The entry point of every child process of ``fleetstore stress``:
``python -m fleetstore_stress.child --agent|--worker|--verify|--bytes|--drain CONFIG_JSON``
(one agent, one outbox worker, the set-up or read-back of one target, the bytes it
keeps, or the wait for its outbox workers to settle the backlog)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from fleetstore_stress.agent import _Fleetstore, _Target, agent_main, worker_main


def make_target(cfg: dict[str, Any], agent: int) -> _Target:
    if cfg["target"] == "fleetstore":
        return _Fleetstore(cfg, agent)
    if cfg["target"] == "t3code":
        from fleetstore_stress.t3code import T3code

        return T3code(cfg, agent)
    from fleetstore_stress.peers import TARGETS

    return TARGETS[cfg["target"]](cfg, agent)


def prepare(cfg: dict[str, Any]) -> None:
    """Create the target's schema once, before the agents start."""
    if cfg["target"] == "fleetstore":
        import fleetstore

        fleetstore.open(cfg["url"], **cfg["settings"]).close()
    elif cfg["target"] == "t3code":
        from fleetstore_stress.t3code import prepare as prepare_t3code

        prepare_t3code(cfg)
    else:
        from fleetstore_stress.peers import prepare as prepare_peer

        prepare_peer(cfg)


def drain(cfg: dict[str, Any]) -> dict[str, Any]:
    """Wait up to ``cfg["drain_wait"]`` seconds for fleetstore's outbox to have nothing
    pending or running (the workers still run); say how long it took and what is left."""
    import fleetstore

    began = time.monotonic()
    deadline = began + float(cfg["drain_wait"])
    with fleetstore.open(cfg["url"], **cfg["settings"]) as store:
        while True:
            counts = store.effects.counts()
            left = counts["pending"] + counts["running"]
            if left == 0 or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    return {"waited_s": round(time.monotonic() - began, 3), "left": left}


def main(argv: list[str]) -> int:
    modes = ("--agent", "--worker", "--verify", "--bytes", "--drain")
    if len(argv) != 2 or argv[0] not in modes:
        print(
            "usage: python -m fleetstore_stress.child "
            "--agent|--worker|--verify|--bytes|--drain CONFIG_JSON",
            file=sys.stderr,
        )
        return 2
    cfg: dict[str, Any] = json.loads(argv[1])
    if argv[0] == "--agent":
        return agent_main(cfg, make_target)
    if argv[0] == "--worker":
        return worker_main(cfg)
    if argv[0] == "--drain":
        print(json.dumps(drain(cfg)))
        return 0
    if argv[0] == "--bytes":
        from fleetstore_stress.sizes import measure

        print(json.dumps(measure(cfg)))
        return 0
    if cfg.get("prepare"):
        prepare(cfg)
        print(json.dumps({"prepared": True}))
        return 0
    from fleetstore_stress.verify import verify_main

    print(json.dumps(verify_main(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
