"""structlog setup. A library logs quietly: an application that imports oxinfer and configures nothing
sees warnings and errors only (Python's convention for libraries); `oxinfer run`, `serve` and
`bench` choose their own level, and an application asks for more with `configure_logging("INFO")`
or its own `structlog.configure`. Event keys are the stats field names."""

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
    """structlog unconfigured prints every level, per-matmul debug lines included: unless the
    application configured it, oxinfer's events reach stderr from WARNING up."""
    if not structlog.is_configured():
        configure_logging("WARNING")
