"""``python -m mpt_lab.experiments``: --list, --all, --unpack (:mod:`mpt_lab.harness.cli` does the work; this
package hands it the catalogue of experiments)."""

from __future__ import annotations

import sys

from .. import experiments
from ..harness import cli


def main(argv: list[str] | None = None) -> int:
    """The command line of :mod:`mpt_lab.harness.cli` over this package's experiments; returns the exit status."""
    return cli.main(argv, experiments=experiments)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
