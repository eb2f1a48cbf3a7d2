"""What overlapped communication costs the compute it hides behind.

A hidden all-reduce is not free. On a GPU, NCCL's kernels take SMs (one per channel: they do not share an SM with
compute kernels, NVIDIA/nccl#689) and memory bandwidth (each byte sent is written to and read from memory two or
three times, NVIDIA/nccl#1428) from the backward pass running beside them; on a CPU, gloo's threads take cores and
memory bandwidth from the compute threads. The backward pass runs slower while the all-reduce runs:

    slow-down(step) = factor · hidden,

``hidden`` the seconds of communication the backward pass hid (:mod:`~dlscale.scaling.overlap`), ``factor`` the
extra compute per second of communication running beside it: 0 is the old model's free overlap, 1 makes a hidden
second cost as much as an exposed one (the hidden all-reduce can then gain nothing).

**The published default**, :data:`OVERLAP_SLOWDOWN` = 0.189: Lee, Oh, Kim, Go, Park and Mahajan 2025,
"Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power
Implications" (arXiv:2507.03114), measured compute overlapped with communication on 4 A100, H100, MI250 and MI210
(GPT and LLaMA models) at 18.9% slower on average than the same compute alone, 40% at most. Those are the compute's
seconds while it overlaps; taking them per second of hidden communication assumes that the two overlap for as long as
the communication runs, which is what a hidden all-reduce does. Single kernels can lose more (a GEMM beside
an all-gather ran 1.8× its time alone, NVIDIA/nccl#1428): the factor is an average over a step, not a bound.

**Measured here**: ``dlscale bench overlap`` times the backward pass of the engine's model alone and with an
all-reduce running beside it (gloo on CPUs; NCCL on GPUs), and writes the factor (:func:`measured_slowdown`).
"""

from __future__ import annotations

import json
from pathlib import Path

from dlscale.errors import RangeError

#: Compute overlapped with communication runs this much slower, per second of overlap (Lee et al. 2025,
#: arXiv:2507.03114: 18.9% on average over A100, H100, MI250 and MI210; 40% at most).
OVERLAP_SLOWDOWN = 0.189
OVERLAP_SLOWDOWN_SOURCE = "Lee et al. 2025, arXiv:2507.03114: compute overlapped with communication 18.9% slower"


def slowdown_seconds(hidden_seconds: float, factor: float = OVERLAP_SLOWDOWN) -> float:
    """The compute a step loses to the communication it hid: ``factor`` seconds per second hidden."""
    return factor * max(0.0, hidden_seconds)


def measured_slowdown(path: str | Path) -> tuple[float, str]:
    """The factor a ``dlscale bench overlap`` run measured (its ``overlap.json``) and one line saying where it comes
    from; a file that holds none is a :class:`RangeError` naming it. A factor above 1 (a hidden second costing more
    than an exposed one: oversubscribed cores, say) is held at 1, the most a projection takes, and the line says
    so."""
    path = Path(path)
    try:
        result = json.loads(path.read_text())
        factor = float(result["slowdown"])
        where = f"measured: {result['machine']}, {result['backend']} on {result['ranks']} ranks ({path})"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise RangeError(
            f"{path} gives no slow-down ({getattr(err, 'strerror', None) or type(err).__name__}): give the "
            "overlap.json of a `dlscale bench overlap` run"
        ) from None
    if factor > 1:
        where += f"; {factor:.2f} measured, held at 1"
    return min(1.0, max(0.0, factor)), where
