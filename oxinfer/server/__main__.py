"""`python -m oxinfer.server [serve flags]`: the same as `oxinfer serve` (one engine; Ray: `oxinfer serve --ray`)."""

import argparse
import sys

from oxinfer.cli import exit_status
from oxinfer.logs import configure_logging
from oxinfer.server.cli import add_serve_parser, serve_command


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m oxinfer.server")
    sub = p.add_subparsers(dest="command")
    add_serve_parser(sub).set_defaults(log_level="INFO", log_format="console")
    args = p.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])

    def command() -> None:
        configure_logging(args.log_level, json=args.log_format == "json")
        serve_command(args)

    return exit_status(command)


if __name__ == "__main__":
    sys.exit(main())
