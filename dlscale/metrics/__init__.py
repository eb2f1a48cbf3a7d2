"""What a run measures: step rows (:mod:`~dlscale.metrics.steplog`), the CSV and W&B files
(:mod:`~dlscale.metrics.tracking`), samples/s (:mod:`~dlscale.metrics.throughput`), validation
(:mod:`~dlscale.metrics.evaluation`), the gradient noise scale (:mod:`~dlscale.metrics.noise_scale`),
bytes per rank (:mod:`~dlscale.metrics.memory`) and the largest weight difference between two
models (:mod:`~dlscale.metrics.weight_difference`).
"""
