"""Constraints that pin every dependency of pyproject.toml (and of the extras named) to the lowest
version its specifier allows: `make test-floors` installs them and runs the tests that touch each
dependency, so a floor the code does not work with fails there, not on a user's machine.

    python tools/floors.py test server > floors.txt
"""

import re
import sys
import tomllib
from pathlib import Path


def floors(extras: list[str]) -> dict[str, str]:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    out = {}
    for spec in specs:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", spec)
        name, rest = m.group(1), m.group(3)
        if name == "oxinfer":  # an extra of our own: its dependencies are listed by name above
            continue
        low = re.search(r"(>=|==)\s*([0-9][^,;\s]*)", rest)
        if low is None:
            raise SystemExit(f"pyproject.toml: {spec!r} has no lower bound (>= or ==): give it one")
        out[name.lower()] = low.group(2)
    return out


if __name__ == "__main__":
    extras = sys.argv[1:]
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    for extra in list(extras):  # extras that pull in others (test -> oxinfer[server])
        for spec in project["optional-dependencies"][extra]:
            m = re.match(r"oxinfer\[([^\]]+)\]", spec)
            if m:
                extras += [e for e in m.group(1).split(",") if e not in extras]
    for name, version in floors(extras).items():
        print(f"{name}=={version}")
