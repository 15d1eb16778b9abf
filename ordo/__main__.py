"""The `ordo` command (and `python -m ordo`): stop signals are taken before the command line's
imports, which take a second or more, so that a SIGTERM at any moment of a start-up is a
clean stop (ordo/stopping.py)."""

from __future__ import annotations

import sys

from ordo import stopping


def main() -> int:
    stopping.install()
    from ordo.cli import main as run_command

    return run_command()


if __name__ == "__main__":
    sys.exit(main())
