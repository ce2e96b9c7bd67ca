"""Types of the compiled prefix-sharing walk (``_reuse.pyx``), for mypy."""

import numpy as np
from numpy.typing import NDArray

def prefix_columns(
    ids: NDArray[np.int64], counts: NDArray[np.int64], blocks: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]: ...
