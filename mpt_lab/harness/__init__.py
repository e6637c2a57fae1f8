"""The machinery written once, that every experiment and benchmark runs on (a floor below
:mod:`mpt_lab.experiments`, above the numerics, training and report it drives):

* :mod:`~mpt_lab.harness.runner`: profiles as data, seeding, threads, device, provenance, JSON, deadlines, one
  experiment's command line (``python -m mpt_lab.experiments.NAME``);
* :mod:`~mpt_lab.harness.cli`: every experiment, one command (``python -m mpt_lab.experiments --list``, ``--all``,
  ``--unpack``), over the catalogue the experiments hand it;
* :mod:`~mpt_lab.harness.budget`: the full profile's priority table (expected seconds on one H100);
* :mod:`~mpt_lab.harness.slot`: a GPU slot's results in one archive, and back into ``book/results/``;
* :mod:`~mpt_lab.harness.preflight`: every CUDA code path the experiments use, once (``python -m
  mpt_lab.harness.preflight``);
* :mod:`~mpt_lab.harness.torchrun`: starting and stopping torchrun for the experiments on several processes;
* :mod:`~mpt_lab.harness.benchmark`: the base of the scripts in ``benchmarks/``.

The harness never imports an experiment: the experiments stand on the floor above and are handed to it
(:class:`~mpt_lab.harness.runner.Catalogue`).
"""
