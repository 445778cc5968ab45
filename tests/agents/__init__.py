"""Programs the tests run as child processes (``python tests/agents/NAME.py ...``):
fleet agents, outbox workers, framework runners.  They are scripts, not test modules."""

from pathlib import Path

HERE = Path(__file__).parent


def script(name: str) -> str:
    """The path of the agent program *name* (``"history_agent.py"``)."""
    path = HERE / name
    assert path.is_file(), path
    return str(path)
