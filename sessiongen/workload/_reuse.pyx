# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""The prefix-sharing facts of :mod:`sessiongen.workload.reuse`, compiled.

The same walk as ``prefix_facts``' Python loop, reference by reference in file order,
with the same Fenwick tree over reference times; what differs is representation only.
The caller densifies the hash ids to 0..k-1, so a block's latest reference time is an
array slot (0: never referenced; times start at 1) rather than a dict entry, and the
tree is sized once for every reference instead of growing. Two shortcuts leave the
results unchanged: at time t no position after t-1 holds a mark, so the Python loop's
``prefix(t - 1)`` is the number of marks set, kept as a counter; and a distance is
counted only for a leading block, the only one whose distance is used.
``tests/unit/workload/test_reuse.py`` compares the two on random traces.
"""

from libc.stdint cimport int64_t

import numpy as np


cdef inline void _add(int64_t[::1] tree, Py_ssize_t i, int64_t delta) noexcept nogil:
    cdef Py_ssize_t n = tree.shape[0]
    while i < n:
        tree[i] += delta
        i += i & -i


cdef inline int64_t _prefix(int64_t[::1] tree, Py_ssize_t i) noexcept nogil:
    cdef int64_t total = 0
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


def prefix_columns(const int64_t[::1] ids, const int64_t[::1] counts, Py_ssize_t blocks):
    """(shared leading blocks, reuse distance or -1) of each request, as int64 arrays.

    ``ids``: every request's hash ids in file order, densified to 0..blocks-1;
    ``counts``: how many of them each request has, in order (summing to ``len(ids)``).
    """
    cdef Py_ssize_t n = ids.shape[0], requests = counts.shape[0]
    if np.any(np.asarray(counts) < 0) or np.sum(counts) != n:
        raise ValueError(f"counts: expected non-negative counts summing to {n} ids")
    if n and not (0 <= np.min(ids) and np.max(ids) < blocks):
        raise ValueError(f"ids: expected densified ids in 0..{blocks - 1}")
    cdef int64_t[::1] tree = np.zeros(n + 1, dtype=np.int64)
    cdef int64_t[::1] last = np.zeros(blocks, dtype=np.int64)
    shared_out = np.zeros(requests, dtype=np.int64)
    distance_out = np.full(requests, -1, dtype=np.int64)
    cdef int64_t[::1] shared_view = shared_out
    cdef int64_t[::1] distance_view = distance_out
    cdef Py_ssize_t r, j, t = 0, end
    cdef int64_t h, p, d, marked = 0, shared, distance
    cdef bint leading
    with nogil:
        for r in range(requests):
            shared, distance, leading = 0, -1, True
            end = t + counts[r]
            while t < end:
                h = ids[t]
                t += 1
                p = last[h]
                if p == 0:
                    leading = False
                    marked += 1
                else:
                    if leading:
                        d = marked - _prefix(tree, p)
                        shared += 1
                        if d > distance:
                            distance = d
                    _add(tree, p, -1)
                _add(tree, t, 1)
                last[h] = t
            shared_view[r] = shared
            distance_view[r] = distance
    return shared_out, distance_out
