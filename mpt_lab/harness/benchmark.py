"""Benchmarks on the experiment runner: a script in ``benchmarks/`` is an experiment run from its own file.

A benchmark measures how fast or how large something is (``benchmarks/round_to_speed.py``, ...); it has a
Config, profiles as data, a ``measure`` and a Result, exactly as an experiment (:mod:`mpt_lab.harness.
runner`), and gets the same seeding, threads, device, provenance, JSON and command line::

    python benchmarks/NAME.py --profile cpu --out book/results/NAME_cpu.json [--set key=value ...]

The one difference is the command that regenerates a result: ``python benchmarks/NAME.py ...`` rather than
``python -m mpt_lab.experiments.NAME ...``.  A benchmark is not one of :data:`mpt_lab.experiments.NAMES` (the
book's reproduced results), so ``python -m mpt_lab.experiments --all`` does not run it.  Speed is reported,
never asserted (ARCHITECTURE.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

from .runner import Experiment, ExperimentConfig, ExperimentResult

__all__ = ["Benchmark", "TimingTable"]


class Benchmark(Experiment):
    """An :class:`~mpt_lab.harness.runner.Experiment` whose module is the script ``benchmarks/NAME.py``.

    Parameters as :class:`~mpt_lab.harness.runner.Experiment`; ``main(argv)`` is the script's command line.
    """

    def command(self, config: ExperimentConfig | None = None, out: str | os.PathLike | None = None) -> str:
        """The command line that runs ``config``: ``python benchmarks/NAME.py --profile P [--set ...] [--out F]``."""
        cmd = super().command(config, out)
        return cmd.replace(f"python -m mpt_lab.experiments.{self.name}", f"python benchmarks/{self.name}.py", 1)


@dataclass
class TimingTable(ExperimentResult):
    """A benchmark's table of timings, measured on a machine shared with other work.

    ``rows``: one dict per measured case; ``summary``: name → ratio; ``load_average``: the machine's 1-minute load
    average at the ``start`` and the ``end`` of the run (and ``cpus``, its CPU count, where recorded).
    Subclasses say how a row reads (:meth:`row_text`) and what a summary entry is (:attr:`SUMMARY`).
    """

    SUMMARY: ClassVar[str] = "{key}: {ratio:.2f}"

    load_average: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    def row_text(self, row: dict) -> str:
        """One row as a line of :meth:`describe` (subclasses say how their rows read)."""
        return str(row)

    def describe(self) -> str:
        lines = [self.row_text(r) for r in self.rows]
        lines += [self.SUMMARY.format(key=key, ratio=ratio) for key, ratio in self.summary.items()]
        load = self.load_average
        cpus = f" on {load['cpus']} CPUs" if "cpus" in load else ""
        lines.append(f"load average (1 min): start {load['start']:.2f}, end {load['end']:.2f}{cpus}")
        return "\n".join(lines)
