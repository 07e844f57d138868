"""The one exception type for bad input: tools turn it into a one-line message and exit code 2."""

from __future__ import annotations


class ArenaError(Exception):
    """A problem with the user's input or environment, reported as one line (never a traceback)."""

    exit_code = 2

    def __init__(self, message: str):
        # Keep the message on one line whatever the caller passed.
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)
