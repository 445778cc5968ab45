"""What a transcript can be written as: the formats and the default width of tool
arguments and outputs.  Here, not in admin/transcript.py, so that the options of
``fleetstore sessions show`` name them without loading the store for ``--help``
(tests/cli/test_startup.py)."""

from __future__ import annotations

FORMATS = ("text", "markdown", "json")
#: Characters of a tool call's arguments or a tool's output shown in text and Markdown.
DEFAULT_WIDTH = 500

__all__ = ["DEFAULT_WIDTH", "FORMATS"]
