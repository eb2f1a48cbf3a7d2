"""A sparse (CSR) ``X`` made dense for the torch engine, when it fits in the memory this machine has free.

Why dense: every pass of Lloyd's iterations reads whole rows (the compiled loop's tiles, the GEMM's chunks,
the sums), and a dense row's features are read with SIMD where a sparse row's are gathered one by one; a sparse
product would also round the distances otherwise than ``predict`` and the compiled pass do. So the matrix is
made dense once, n × d in its dtype, and a fit holds it twice (the data less its mean is a copy). Before that,
the size is checked against the memory free, and a matrix too large is refused in one line that says what to do,
not left to the operating system's out-of-memory killer.
"""

from __future__ import annotations

import numpy as np

from dlscale.kmeans.errors import KMeansError
from dlscale.runtime.memory import available_memory

#: Copies of the dense matrix a fit holds: the data, and the data less its mean.
COPIES = 2


def dense(matrix) -> np.ndarray:
    """``matrix`` (scipy sparse, validated) as a C-contiguous dense array, or a KMeansError when it cannot fit."""
    rows, features = matrix.shape
    needed = COPIES * rows * features * matrix.dtype.itemsize
    free = available_memory()
    if free is not None and needed > free:
        raise KMeansError(
            f"a sparse X of {rows:,} × {features:,} is made dense to be clustered ({needed / 2**30:.1f} GiB with "
            f"its centred copy), more than the {free / 2**30:.1f} GiB free here: give each rank fewer rows (more "
            "ranks), reduce the features first (TruncatedSVD), or use scikit-learn's KMeans, which keeps X sparse"
        )
    return np.ascontiguousarray(matrix.toarray())
