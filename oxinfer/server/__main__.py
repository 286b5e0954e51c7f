"""`python -m oxinfer.server [serve flags]`: the same as `oxinfer serve` (one engine; Ray: `oxinfer serve --ray`)."""

import argparse
import sys

from oxinfer.cli import exit_status
from oxinfer.logs import configure_logging
from oxinfer.server.cli import add_serve_parser, serve_command


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oxinfer.server")
    sub = p.add_subparsers(dest="command")
    add_serve_parser(sub).add_argument("--log-level", default="INFO", help="structlog level")
    args = p.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    configure_logging(args.log_level)
    return exit_status(lambda: serve_command(args))


if __name__ == "__main__":
    sys.exit(main())
