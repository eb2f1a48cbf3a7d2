"""The unit tier: tests that start no system beside them (make test-fast runs these alone)."""
