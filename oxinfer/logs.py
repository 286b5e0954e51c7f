"""structlog setup: INFO and up unless asked otherwise. Event keys are the stats field names."""

from __future__ import annotations

import logging
import sys

import structlog


class _CurrentStderr:
    """Whatever sys.stderr is when a line is written: pytest, notebooks and daemons swap it, and a
    logger holding the old one writes to a closed file ("I/O operation on closed file")."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str | int = "INFO", json: bool = False) -> None:
    """Route oxinfer's structlog events to stderr at `level` (the CLI and server call this)."""
    if isinstance(level, str):
        level = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),
        cache_logger_on_first_use=False,
    )


def ensure_configured() -> None:
    """Per-matmul debug lines would flood an unconfigured app: default to INFO on stderr."""
    if not structlog.is_configured():
        configure_logging()
