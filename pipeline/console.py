"""The terminal of a `loopline` command whose standard error goes to its log (pipeline/run_log.py):
what a person reads while it runs, in short lines.

Shown: records of the loggers in SHOWN at INFO (the training's per-evaluation lines when no
progress bar is drawn, a server's loaded and unloaded versions), any `loopline` record at WARNING
or above, the pipeline's component lines, and whatever Python code writes to `sys.stderr` (a
progress bar, the run lock's waiting line, the final error). Everything else (TensorFlow's C++
lines, library warnings, INFO records) is in the log only.
"""
from __future__ import annotations

import logging
from typing import TextIO

# Loggers whose INFO records are progress a person follows. trainer.summaries.Progress logs the
# per-evaluation lines to the first only when it draws no bar; serving.manager logs versions to the second.
SHOWN = ("loopline.trainer.progress", "loopline.serving.versions")


class Console:
    """The terminal stream, with at most one line left open (a component that has started and
    not ended). Anything else written closes that line first, so nothing is written into it."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.open_line = False

    def write(self, text: str) -> int:
        if text and self.open_line:
            self.stream.write("\n")
            self.open_line = False
        return self.stream.write(text)

    def begin(self, text: str) -> None:
        """Starts a line to be completed by `end` (when nothing else was written in between)."""
        self.write(text)
        self.open_line = True
        self.stream.flush()

    def end(self, start: str, rest: str) -> None:
        """Completes the open line with `rest`, or writes `start + rest` when it was closed."""
        if self.open_line:
            self.stream.write(rest + "\n")
            self.open_line = False
        else:
            self.stream.write(start + rest + "\n")
        self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name):  # encoding, fileno... of the terminal stream (tqdm asks)
        return getattr(self.stream, name)


def shown(record: logging.LogRecord) -> bool:
    if record.name in SHOWN:
        return record.levelno >= logging.INFO
    return record.levelno >= logging.WARNING and (record.name == "loopline" or record.name.startswith("loopline."))


class ConsoleHandler(logging.Handler):
    """Writes the records a person should see to the console: progress as it is, warnings and
    errors as `loopline: warning: ...` (their tracebacks stay in the log)."""

    def __init__(self, console: Console):
        super().__init__(logging.INFO)
        self.console = console

    def filter(self, record: logging.LogRecord) -> bool:
        return shown(record) and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.name not in SHOWN:
                message = f"loopline: {record.levelname.lower()}: {message}"
            self.console.write(message + "\n")
            self.console.flush()
        except Exception:  # noqa: BLE001 - logging's rule: a failing handler must not stop the program
            self.handleError(record)
