"""The integration tier: tests that start processes or systems beside them (launched ranks or runs, engines, a
Slurm cluster, kernels, a browser, a fresh install); make test runs them with the unit tier."""
