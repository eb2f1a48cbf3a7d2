"""What memory this machine can give a new allocation now: checked before work that would not fit."""

from __future__ import annotations

from pathlib import Path


def available_memory() -> int | None:
    """Bytes of memory free for new allocations (Linux's MemAvailable), or None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
