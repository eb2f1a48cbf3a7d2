"""The suite's pytest plugins: how make test spreads the tests over its processes (scheduling), what a session
leaves running (reaper), and what a run leaves out (skips). tests/conftest.py registers them and holds only fixtures
and settings."""
