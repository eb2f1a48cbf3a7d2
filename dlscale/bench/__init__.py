"""Benchmarks: every ratio measured side by side in one run, one module per benchmark.

- :mod:`~dlscale.bench.optimizers` (``dlscale bench optim``), :mod:`~dlscale.bench.loader`
  (``bench loader``), :mod:`~dlscale.bench.ladder` (``bench ladder``),
  :mod:`~dlscale.bench.allreduce` (``bench allreduce``), :mod:`~dlscale.bench.scaling`
  (``bench scaling``), :mod:`~dlscale.bench.memory` (``bench memory``),
  :mod:`~dlscale.bench.kmeans` (``bench kmeans``), :mod:`~dlscale.bench.ddp_cost` (``bench ddp-cost``: DDP's own
  cost on one rank), :mod:`~dlscale.bench.overlap_slowdown` (``bench overlap``: the backward pass slowed by an
  all-reduce beside it);
- :mod:`~dlscale.bench.breakdown_terms`: the breakdown's exposed communication split into the scaling model's terms;
- :mod:`~dlscale.bench.large_batch`: lesson 07's large-batch sweep (``dlscale experiment large-batch``);
- :mod:`~dlscale.bench.pipeline`: the pipeline's bubble and held activations per stage, beside the textbook's;
- :mod:`~dlscale.bench.repeats`: rounds that take turns, and their spread.
"""
