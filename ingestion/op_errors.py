"""A TensorFlow op error's own words on one line, for errors that name a user's file or example.
An op error's message carries the op's and device's names and, from graph execution, the Python
stack where the op was made; the words to show follow that stack. Standard library only."""
from __future__ import annotations

import re

_OP_NAMES = re.compile(r"{{.*?}}|\[\[.*?\]\]|\[Op:[\w.]+\]( name: \S*)?")
_STACK_LINE = re.compile(r'^\s*File "')


def op_message(exc: Exception) -> str:
    """The first line of what the op said (`exc.message`, else `str(exc)`)."""
    lines = _OP_NAMES.sub("", getattr(exc, "message", None) or str(exc)).splitlines()
    stack = [i for i, line in enumerate(lines) if _STACK_LINE.match(line)]
    if stack:  # "Graph execution error: Detected at node ... defined at:", then the stack's lines
        lines = [line for line in lines[stack[-1] + 1:] if line[:1].strip()]
    lines = [line for line in lines if line.strip()]
    return " ".join(lines[0].split()) if lines else type(exc).__name__
