# distutils: language = c++
# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False, infer_types=False
"""The simulator's engine, compiled: the planner's hot loop, and the served pair's.

The timing terms are not ported: this module includes the text of
:mod:`sessiongen.sim.timing`, which the Python engine imports (one source, compiled
here). The rest is a line-by-line port of :mod:`sessiongen.sim.cluster`,
:mod:`~sessiongen.sim.scheduler`, :mod:`~sessiongen.sim.kvcache`,
:mod:`~sessiongen.sim.pool` and the pool's LRU in :mod:`~sessiongen.sim.cache`, for :class:`sessiongen.sim.virtual.VirtualDriver` and the
served simulator's :class:`sessiongen.sim.engine.World`. Those
Python modules are the reference: every decision here is theirs, in the same order,
with the same floating-point expressions evaluated in the same order (the build turns
off contraction into fused multiply-adds), so both engines give the same records to the
bit; ``tests/unit/sim/test_engines.py`` plans every shipped scenario with both and
compares them, and random small workloads with caches small enough to evict and
preempt; ``tests/unit/sim/test_served_engines.py`` serves one workload on both.

What differs is representation only: requests, steps and KV runs are typed objects
whose fields are C numbers; a run's keys are a pointer into the request's key array
(kept alive by a reference), compared without numpy; a request's keys come in the two
pieces of ``KeyChain.segments`` and a new run is cut where they join; the pool's LRU is
a hash map with an intrusive list; the event queue and the KV free queue are binary
heaps of C structs. Integer division is written as in Python for the non-negative
operands it sees (``cdivision``: no sign fix-ups), ceilings as ``(a + b - 1) // b``.

Sections, in the order the data flows: the profile's numbers and the timing terms;
key storage; one replica's KV cache; the heap; the shared pool; requests, steps and
the scheduler; the cluster and its event queue (the one public class); the chain hash;
a trace prompt's token ids from its hash ids.
"""

from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.math cimport INFINITY
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

import numpy as np

from cython.operator cimport dereference as deref


# --- the profile's numbers and the timing terms (timing.py, the one source) ------------

include "timing.py"

#: The files this module is compiled from (an editable install is stale when one is newer).
SOURCES = ("_core.pyx", "timing.py")


def timing_terms():
    """The timing terms as compiled here, callable from Python (for the test that
    evaluates each term in both engines)."""
    return {
        "prefill_s": lambda p, u, c: prefill_s(p, u, c),
        "decode_step_s": lambda p, s, c: decode_step_s(p, s, c),
        "pool_store_s": lambda p, t: pool_store_s(p, t),
        "pool_fixed_s": lambda p: pool_fixed_s(p),
        "pool_transfer_s": lambda p, t: pool_transfer_s(p, t),
        "hit_overhead_s": lambda p, h: hit_overhead_s(p, h),
        "boundary": lambda s, d, e, n: boundary(s, d, e, n),
        "run_delta": lambda p, d, c, q: run_delta(p, d, c, q),
        "steps_reaching": lambda d, e, t: steps_reaching(d, e, t),
    }


cdef inline int64_t cdiv(int64_t a, int64_t b) noexcept:
    """Ceiling division of a non-negative ``a`` (Python's ``-(-a // b)``)."""
    return (a + b - 1) // b


# --- key storage -----------------------------------------------------------------------

cdef class _Keys:
    """Keys owned here (a released run's copy); its vector never moves once filled."""

    cdef vector[uint64_t] data


cdef inline const uint64_t* _pointer(object array, Py_ssize_t* length) except? NULL:
    """The first element of a C-contiguous uint64 array (NULL when empty)."""
    cdef const uint64_t[::1] view = array
    length[0] = view.shape[0]
    if view.shape[0] == 0:
        return NULL
    return &view[0]


cdef inline Py_ssize_t _common(
    const uint64_t* run, const uint64_t* keys, Py_ssize_t pos, Py_ssize_t n
) noexcept:
    """``kvcache._common``: leading keys of ``run[:n]`` equal to ``keys[pos:]`` (chain
    keys: the last decides a whole run, a mismatch is found by bisection)."""
    cdef Py_ssize_t lo, hi, mid
    if run[n - 1] == keys[pos + n - 1]:
        return n
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if run[mid] == keys[pos + mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline Py_ssize_t _common_req(
    const uint64_t* run, _Req req, Py_ssize_t pos, Py_ssize_t n
) noexcept:
    """:func:`_common` against a request's keys from ``pos``, across its two pieces."""
    cdef Py_ssize_t head, same
    if pos >= req.nhead:
        return _common(run, req.keys, pos - req.nhead, n)
    if pos + n <= req.nhead:
        return _common(run, req.head, pos, n)
    head = req.nhead - pos
    same = _common(run, req.head, pos, head)
    if same < head:
        return same
    return head + _common(run + head, req.keys, 0, n - head)


# --- one replica's KV cache (kvcache.py) ----------------------------------------------

cdef class _Node:
    cdef object owner  # keeps ``ptr`` alive: the request's key array, or a _Keys
    cdef const uint64_t* ptr
    cdef Py_ssize_t n
    cdef Py_ssize_t owner_len  # keys in the owner's buffer (a copy when much larger)
    cdef int64_t start
    cdef _Node parent
    cdef dict children
    cdef object key0
    cdef int64_t refs
    cdef int64_t base

    def __cinit__(self):
        self.children = {}
        self.base = -1


cdef _Node _node(object owner, const uint64_t* ptr, Py_ssize_t n, Py_ssize_t owner_len,
                 int64_t start, _Node parent, int64_t refs):
    cdef _Node node = _Node.__new__(_Node)
    node.owner = owner
    node.ptr = ptr
    node.n = n
    node.owner_len = owner_len
    node.start = start
    node.parent = parent
    node.key0 = ptr[0] if n else -1
    node.refs = refs
    return node


cdef class _Hold:
    cdef _Node last
    cdef int64_t cached
    cdef int64_t raw
    cdef int64_t logical


cdef class _Match:
    cdef _Node node
    cdef Py_ssize_t used
    cdef int64_t blocks
    cdef int64_t free_blocks


# --- a binary heap of C structs (heapq's order over tuples, without the tuples) -------

cdef struct _Item:
    double key  # an event's time, or a free KV run's counter
    int64_t kind  # events: 0 arrival, 1 step boundary (arrivals first at equal times)
    int64_t seq  # push order: unique, so no two items tie
    int64_t replica  # events
    int64_t version  # events: a boundary is stale unless it matches its replica's
    PyObject* obj  # free KV runs: the run (its owner holds the reference)


cdef inline bint _before(const _Item& a, const _Item& b) noexcept:
    if a.key != b.key:
        return a.key < b.key
    if a.kind != b.kind:
        return a.kind < b.kind
    return a.seq < b.seq


cdef class _Heap:
    """Smallest (key, kind, seq) on top: the order in which the Python engine's heapq
    pops its tuples, which start with those fields (seq is unique, so the rest of a
    tuple is never compared)."""

    cdef vector[_Item] items

    cdef inline size_t size(self) noexcept:
        return self.items.size()

    cdef void push(self, _Item item) noexcept:
        cdef size_t i, parent
        self.items.push_back(item)
        i = self.items.size() - 1
        while i > 0:
            parent = (i - 1) // 2
            if not _before(item, self.items[parent]):
                break
            self.items[i] = self.items[parent]
            i = parent
        self.items[i] = item

    cdef _Item pop(self) noexcept:
        cdef _Item top = self.items[0]
        cdef _Item last = self.items.back()
        self.items.pop_back()
        if self.items.size():
            self._settle(last)
        return top

    cdef _Item replace(self, _Item item) noexcept:
        """Pop the top and push ``item`` (``heapq.heapreplace``); returns the old top."""
        cdef _Item top = self.items[0]
        self._settle(item)
        return top

    cdef void _settle(self, _Item item) noexcept:
        """Put ``item`` in the top's place and sift it down."""
        cdef size_t n = self.items.size(), i = 0, child
        while True:
            child = 2 * i + 1
            if child >= n:
                break
            if child + 1 < n and _before(self.items[child + 1], self.items[child]):
                child += 1
            if not _before(self.items[child], item):
                break
            self.items[i] = self.items[child]
            i = child
        self.items[i] = item


cdef class _KVCache:
    cdef readonly int64_t capacity
    cdef int64_t block_tokens
    cdef _Node root
    cdef int64_t cached
    cdef int64_t evictable
    cdef int64_t raw
    cdef _Heap heap  # kvcache.py's heapq of (base, seq, run); holds a reference to each run
    cdef int64_t tick
    cdef int64_t seq
    cdef int64_t evicted_blocks

    def __init__(self, int64_t capacity_blocks, int64_t block_tokens):
        self.capacity = capacity_blocks
        self.block_tokens = block_tokens
        self.root = _node(None, NULL, 0, 0, 0, None, 1)
        self.heap = _Heap()

    def __dealloc__(self):
        cdef size_t i
        if self.heap is not None:
            for i in range(self.heap.size()):
                Py_DECREF(<object>self.heap.items[i].obj)
            self.heap.items.clear()

    cdef inline _Item _free(self, int64_t base, _Node node) noexcept:
        cdef _Item item
        Py_INCREF(node)
        item.key, item.kind, item.seq, item.obj = <double>base, 0, self.seq, <PyObject*>node
        self.seq += 1
        return item

    cdef void _push(self, int64_t base, _Node node):
        self.heap.push(self._free(base, node))

    cdef void _pop(self):
        Py_DECREF(<object>self.heap.pop().obj)

    cdef void _replace(self, int64_t base, _Node node):
        Py_DECREF(<object>self.heap.replace(self._free(base, node)).obj)

    cdef inline int64_t used_blocks(self) noexcept:
        return self.raw + self.cached - self.evictable

    cdef inline int64_t available_blocks(self) noexcept:
        return self.capacity - self.used_blocks()

    @property
    def usage(self):
        """``KVCache.usage``: the held share of all blocks (0..1)."""
        return <double>self.used_blocks() / <double>self.capacity if self.capacity else 0.0

    cdef _Match match(self, _Req req, int64_t limit_blocks):
        cdef _Node node = self.root
        cdef _Node child
        cdef Py_ssize_t pos = 0, n, used, limit
        cdef int64_t free = 0
        cdef _Match out = _Match.__new__(_Match)
        cdef object found
        limit = min(<Py_ssize_t>limit_blocks, req.nkeys)
        while pos < limit:
            found = node.children.get(req.key(pos))
            if found is None:
                break
            child = <_Node>found
            n = min(child.n, limit - pos)
            used = _common_req(child.ptr, req, pos, n)
            if child.refs == 0:
                free += used
            pos += used
            if used < child.n:
                out.node, out.used, out.blocks, out.free_blocks = child, used, pos, free
                return out
            node = child
        out.node, out.used, out.blocks, out.free_blocks = node, node.n, pos, free
        return out

    cdef void acquire(self, _Hold hold, _Match match):
        cdef _Node node = match.node
        if match.used < node.n:
            node = self._split(node, match.used)
        hold.last = node
        hold.cached = hold.logical = match.blocks
        while node is not self.root:
            self._ref(node)
            node = node.parent

    cdef bint grow(self, _Hold hold, int64_t blocks):
        cdef int64_t free
        if blocks <= 0:
            return True
        free = self.capacity - self.raw - self.cached
        if blocks > free:
            if blocks > free + self.evictable:
                return False
            self._evict(blocks - free)
        self.raw += blocks
        hold.raw += blocks
        hold.logical += blocks
        return True

    cdef void commit(self, _Hold hold, _Req req, int64_t full_blocks):
        cdef int64_t target = min(full_blocks, <int64_t>req.nkeys)
        cdef _Node node, child
        cdef int64_t pos, moved
        cdef Py_ssize_t n, used
        cdef object found
        if target <= hold.cached:
            return
        node = hold.last
        pos = node.start + node.n
        while pos < target and node.children:
            found = node.children.get(req.key(pos))
            if found is None:
                break
            child = <_Node>found
            n = min(<int64_t>child.n, target - pos)
            used = _common_req(child.ptr, req, pos, n)
            if used < child.n:
                child = self._split(child, used)
            self._ref(child)
            node, pos = child, pos + used
        if pos < target:
            if (
                node is not self.root and node.refs == 1 and not node.children
                and (node.start >= req.nhead or target <= req.nhead)
            ):  # only this request holds it and the keys are in one piece: extend it
                if node.start >= req.nhead:
                    node.owner, node.owner_len = req.keys_owner, req.keys_owner_len
                    node.ptr = req.keys + (node.start - req.nhead)
                else:
                    node.owner, node.owner_len = req.head_owner, req.head_owner_len
                    node.ptr = req.head + node.start
                node.n = target - node.start
            else:
                node = self._grow_path(node, req, pos, target)
            moved = target - pos
            hold.raw -= moved
            self.raw -= moved
            self.cached += moved
        hold.last = node
        hold.cached = target

    cdef _Node _grow_path(self, _Node node, _Req req, int64_t pos, int64_t target):
        """New runs for blocks ``pos..target`` below ``node``, one per piece of the
        request's keys they lie in (where kvcache.py makes one run: how blocks are
        grouped into runs changes no lookup, hold or eviction); returns the deepest."""
        cdef _Node child
        cdef int64_t end
        while pos < target:
            if pos < req.nhead:
                end = min(target, <int64_t>req.nhead)
                child = _node(
                    req.head_owner, req.head + pos, end - pos, req.head_owner_len,
                    pos, node, 1,
                )
            else:
                end = target
                child = _node(
                    req.keys_owner, req.keys + (pos - req.nhead), end - pos,
                    req.keys_owner_len, pos, node, 1,
                )
            node.children[child.key0] = child
            node, pos = child, end
        return node

    cdef void release(self, _Hold hold):
        cdef _Node node = hold.last
        cdef _Keys copy
        while node is not self.root:
            node.refs -= 1
            if node.refs == 0:
                if node.owner_len > 2 * node.n:  # keep a copy of its few keys
                    copy = _Keys.__new__(_Keys)
                    copy.data.resize(node.n)
                    memcpy(copy.data.data(), node.ptr, node.n * sizeof(uint64_t))
                    node.owner, node.ptr, node.owner_len = copy, copy.data.data(), node.n
                node.base = self.tick
                self.tick += node.n
                self.evictable += node.n
                self._push(node.base, node)
            node = node.parent
        self.raw -= hold.raw
        hold.last, hold.raw, hold.logical, hold.cached = self.root, 0, 0, 0

    cdef inline void _ref(self, _Node node):
        if node.refs == 0:
            self.evictable -= node.n
        node.refs += 1

    cdef _Node _split(self, _Node node, Py_ssize_t at):
        cdef _Node parent = node.parent
        cdef _Node head = _node(
            node.owner, node.ptr, at, node.owner_len, node.start, parent, node.refs
        )
        parent.children[head.key0] = head
        node.ptr += at
        node.n -= at
        node.start += at
        node.key0 = node.ptr[0]
        node.parent = head
        head.children[node.key0] = node
        if node.refs == 0:
            head.base = node.base + node.n
            self._push(head.base, head)
        return head

    cdef void _evict(self, int64_t blocks):
        cdef _Node node
        cdef int64_t base, size, take
        while blocks > 0:
            base = <int64_t>self.heap.items[0].key
            node = <_Node>self.heap.items[0].obj
            size = node.n
            if node.refs != 0 or node.base != base or not size:
                self._pop()  # stale: held again, trimmed or freed again since
                continue
            take = min(blocks, size)
            node.n = size - take
            node.base += take
            self.evictable -= take
            self.cached -= take
            self.evicted_blocks += take
            blocks -= take
            if size > take:
                self._replace(node.base, node)
            else:
                self._pop()
                del node.parent.children[node.key0]
                node.parent = None


# --- the shared pool: LRU contents (cache.py) and its link (pool.py) -------------------

cdef struct _Entry:
    uint64_t key
    double visible_at
    int64_t prev
    int64_t next


cdef class _Pool:
    """``Pool`` with ``SharedPool``/``_LRUKeys`` inside: an OrderedDict's order as an
    intrusive list over slots (head: least recently used), a hash map from key to slot."""

    cdef public bint on
    cdef int64_t chunk_tokens
    cdef int64_t capacity
    cdef vector[_Entry] entries
    cdef vector[int64_t] free_slots
    cdef unordered_map[uint64_t, int64_t] index
    cdef int64_t head
    cdef int64_t tail
    cdef int64_t evictions
    cdef double link_free_at
    cdef int64_t loads
    cdef double link_wait_s
    cdef Params p

    def __init__(self, bint on, int64_t capacity_entries, Params p):
        self.on = on
        self.chunk_tokens = p.chunk_tokens
        self.capacity = capacity_entries
        self.head = self.tail = -1
        self.link_free_at = -INFINITY
        self.p = p

    cdef inline void _unlink(self, int64_t i) noexcept:
        cdef _Entry* e = &self.entries[i]
        if e.prev >= 0:
            self.entries[e.prev].next = e.next
        else:
            self.head = e.next
        if e.next >= 0:
            self.entries[e.next].prev = e.prev
        else:
            self.tail = e.prev

    cdef inline void _append(self, int64_t i) noexcept:
        cdef _Entry* e = &self.entries[i]
        e.prev = self.tail
        e.next = -1
        if self.tail >= 0:
            self.entries[self.tail].next = i
        else:
            self.head = i
        self.tail = i

    cdef Py_ssize_t prefix_len(self, const uint64_t* keys, Py_ssize_t n, double now):
        cdef Py_ssize_t i = 0
        cdef unordered_map[uint64_t, int64_t].iterator it
        cdef unordered_map[uint64_t, int64_t].iterator end = self.index.end()
        while i < n:
            it = self.index.find(keys[i])
            if it == end or self.entries[deref(it).second].visible_at > now:
                break
            i += 1
        return i

    cdef void insert(self, const uint64_t* keys, Py_ssize_t n, double visible_at):
        """``_LRUKeys.insert``: every key stored (absent ones at ``visible_at``, stored
        ones at the earlier time, or kept when ``visible_at`` is inf), touched from last
        to first, then the least recently used evicted down to capacity."""
        cdef Py_ssize_t j
        cdef int64_t slot
        cdef uint64_t key
        cdef _Entry* e
        cdef unordered_map[uint64_t, int64_t].iterator it
        j = n - 1
        while j >= 0:
            key = keys[j]
            it = self.index.find(key)
            if it == self.index.end():
                if self.free_slots.size():
                    slot = self.free_slots.back()
                    self.free_slots.pop_back()
                else:
                    slot = self.entries.size()
                    self.entries.push_back(_Entry(0, 0.0, -1, -1))
                e = &self.entries[slot]
                e.key = key
                e.visible_at = visible_at
                self.index[key] = slot
            else:
                slot = deref(it).second
                e = &self.entries[slot]
                if visible_at != INFINITY and e.visible_at > visible_at:
                    e.visible_at = visible_at
                self._unlink(slot)
            self._append(slot)
            j -= 1
        while <int64_t>self.index.size() > self.capacity:
            slot = self.head
            self._unlink(slot)
            self.index.erase(self.entries[slot].key)
            self.free_slots.push_back(slot)
            self.evictions += 1

    cdef int64_t lookup(self, _Req req, int64_t limit_tokens, double now, int64_t beyond):
        cdef Py_ssize_t usable
        if not self.on or limit_tokens // self.chunk_tokens * self.chunk_tokens <= beyond:
            return 0
        usable = min(<Py_ssize_t>(max(limit_tokens, 0) // self.chunk_tokens), req.npool)
        return self.prefix_len(req.pool_keys, usable, now) * self.chunk_tokens

    cdef double load(self, double now, int64_t tokens):
        cdef double ready = now + pool_fixed_s(self.p)
        cdef double begin = ready if ready >= self.link_free_at else self.link_free_at
        self.link_wait_s += begin - ready
        self.link_free_at = begin + pool_transfer_s(self.p, tokens)
        self.loads += 1
        return self.link_free_at

    cdef inline void store(self, const uint64_t* keys, Py_ssize_t n, double visible_at):
        if self.on:
            self.insert(keys, n, visible_at)

    def clear(self):
        """``Pool.clear``: empty (the link and its counters stay)."""
        self.index.clear()
        self.entries.clear()
        self.free_slots.clear()
        self.head = self.tail = -1


# --- requests and steps (scheduler.py) -------------------------------------------------

cdef class _Req:
    """One request (``SimRequest``). The served simulator reads its account through the
    read-only attributes, named as ``SimRequest``'s (times None until they happen)."""

    cdef readonly object tag
    cdef int replica
    cdef readonly int64_t prompt_tokens
    cdef readonly int64_t output_tokens
    # Its block keys in two pieces (KeyChain.segments): a prefix other requests share,
    # then its own; ``nkeys`` in all.
    cdef object head_owner
    cdef const uint64_t* head
    cdef Py_ssize_t nhead
    cdef Py_ssize_t head_owner_len
    cdef object keys_owner
    cdef const uint64_t* keys
    cdef Py_ssize_t nkeys
    cdef Py_ssize_t keys_owner_len
    cdef object pool_owner
    cdef const uint64_t* pool_keys
    cdef Py_ssize_t npool
    cdef readonly double arrival
    cdef double prefill_scale
    cdef int64_t computed
    cdef int64_t generated
    cdef bint prefilling
    cdef _Hold hold
    cdef bint admitted
    cdef double admitted_s
    cdef bint has_first
    cdef double first_token_s
    cdef bint finished
    cdef double finished_s
    cdef readonly bint aborted
    cdef readonly int64_t local_hit
    cdef readonly int64_t pool_hit
    cdef readonly int64_t preemptions
    cdef readonly int64_t kv_blocks_at_admission
    cdef readonly int64_t running_at_admission
    cdef readonly int64_t waiting_at_admission
    cdef int64_t pool_stored
    cdef double ready_at
    cdef int64_t n  # tokens scheduled in its replica's current step

    cdef inline int64_t num_tokens(self) noexcept:
        return self.prompt_tokens + self.generated

    cdef inline uint64_t key(self, Py_ssize_t i) noexcept:
        return self.head[i] if i < self.nhead else self.keys[i - self.nhead]

    @property
    def admitted_at(self):
        return self.admitted_s if self.admitted else None

    @property
    def first_token_at(self):
        return self.first_token_s if self.has_first else None

    @property
    def finished_at(self):
        return self.finished_s if self.finished else None

    def set_keys(self, keys):
        """``SimRequest.set_keys``: longer keys for the same tokens (uint64,
        C-contiguous; the output's too, once known), in one piece from here on."""
        cdef Py_ssize_t n
        cdef const uint64_t* ptr = _pointer(keys, &n)
        if n <= self.nkeys:
            return
        self.head = NULL
        self.head_owner, self.nhead, self.head_owner_len = None, 0, 0
        self.keys_owner, self.keys, self.nkeys = keys, ptr, n
        base = keys.base
        self.keys_owner_len = len(base) if base is not None else n


cdef class _Step:
    """One step (``Step``); a listener reads its account (who was admitted, preempted,
    samples at its end, finished) through the read-only attributes."""

    cdef double start
    cdef double duration
    cdef readonly double end
    cdef readonly int64_t count
    cdef double delta
    cdef list work
    cdef readonly list admitted
    cdef readonly list preempted
    cdef readonly list sampled
    cdef readonly list finished
    cdef bint steady
    cdef _Req partial
    cdef bint open

    cdef inline double boundary(self, int64_t steps) noexcept:
        return boundary(self.start, self.duration, self.delta, steps)


cdef _Step _new_step(double start):
    cdef _Step step = _Step.__new__(_Step)
    step.start = start
    step.end = start
    step.count = 1
    step.work = []
    step.admitted = []
    step.preempted = []
    step.sampled = []
    step.finished = []
    return step


cdef object _ready_at(_Req req):
    return req.ready_at


cdef class _Sched:
    """``ReplicaScheduler``: one replica's waiting queue, running batch and KV cache."""

    cdef Params p
    cdef _Pool pool
    cdef readonly _KVCache kv
    cdef readonly object waiting  # collections.deque
    cdef readonly list running
    cdef readonly list loading
    cdef int64_t preemptions
    cdef int64_t steps

    def __init__(self, Params p, _Pool pool, waiting):
        self.p = p
        self.pool = pool
        self.kv = _KVCache(p.cache_blocks, p.block_tokens)
        self.waiting = waiting
        self.running = []
        self.loading = []

    cdef void add(self, _Req req) except *:
        cdef int64_t tokens = req.prompt_tokens + req.output_tokens
        if cdiv(tokens, self.kv.block_tokens) > self.kv.capacity:
            raise ValueError(
                f"request of {tokens} tokens cannot fit in "
                f"a KV cache of {self.kv.capacity * self.kv.block_tokens} tokens"
            )
        self.waiting.append(req)

    cdef object next_ready(self):
        cdef _Req req
        cdef double best = INFINITY
        if not self.loading:
            return None
        for item in self.loading:
            req = <_Req>item
            if req.ready_at < best:
                best = req.ready_at
        return best

    cdef void _take_loaded(self, double now) except *:
        cdef list ready = [r for r in self.loading if (<_Req>r).ready_at <= now]
        if ready:
            ready.sort(key=_ready_at)
            self.loading = [r for r in self.loading if (<_Req>r).ready_at > now]
            self.running.extend(ready)

    cdef _Step schedule(self, double now):
        cdef _Step step
        cdef int64_t budget, prefills = 0, stored = 0, seqs = 0, context = 0
        cdef int64_t n, computed
        cdef double overhead = 0.0, load_done = now, prefill = 0.0
        cdef double decode, load, store
        cdef bint prompt_done = False, prefilling
        cdef list first = []
        cdef list sampled
        cdef _Req req
        if self.loading:
            self._take_loaded(now)
        if not self.running and not self.waiting:
            return None
        step = _new_step(now)
        budget = self.p.max_num_batched_tokens
        if self.running:
            budget = self._schedule_running(step, budget)
        if self.waiting and not step.preempted:
            overhead, load_done, budget = self._schedule_waiting(step, budget, now)
        if not step.work and not step.admitted:
            if step.preempted:  # everybody preempted: vLLM schedules again at once
                return self.schedule(now)
            return None
        sampled = step.sampled
        for item in step.work:
            req = <_Req>item
            n = req.n
            computed, prefilling = req.computed, req.prefilling
            if prefilling:
                prefill += prefill_s(self.p, n, computed) * req.prefill_scale
                prefills += 1
                stored += n
            computed += n
            req.computed = computed
            if computed == req.prompt_tokens + req.generated:
                seqs += 1
                context += computed
                sampled.append(req)
                req.generated += 1
                if prefilling:
                    prompt_done = True
                    req.prefilling = False
                    if not req.has_first:
                        first.append(req)
            elif prefilling:
                step.partial = req
        step.steady = (
            not step.admitted
            and not step.preempted
            and not prompt_done
            and prefills <= 1
            and not self.loading
        )
        step.open = (
            step.partial is None
            and budget > 0
            and not self.waiting
            and len(self.running) < self.p.max_num_seqs
        )
        decode = decode_step_s(self.p, seqs, context)
        load = load_done - now
        store = pool_store_s(self.p, stored) if stored and self.pool.on else 0.0
        step.duration = overhead + load + prefill + store + decode
        step.end = now + step.duration
        for item in first:
            req = <_Req>item
            req.has_first = True
            req.first_token_s = step.end
        self.steps += 1
        return step

    cdef int64_t _schedule_running(self, _Step step, int64_t budget) except? -1:
        cdef _KVCache kv = self.kv
        cdef list running = self.running
        cdef list work = step.work
        cdef int64_t block = kv.block_tokens
        cdef Py_ssize_t i = 0
        cdef _Req req, victim
        cdef _Hold hold
        cdef int64_t computed, n, need
        while i < len(running) and budget > 0:
            req = <_Req>running[i]
            hold = req.hold
            computed = req.computed
            n = req.prompt_tokens + req.generated - computed
            if n > budget:
                n = budget
            need = cdiv(computed + n, block) - hold.logical
            if need > 0:
                while not kv.grow(hold, need):
                    victim = <_Req>running.pop()
                    self._preempt(victim)
                    step.preempted.append(victim)
                    if victim is req:
                        return budget
            req.n = n
            work.append(req)
            budget -= n
            i += 1
        return budget

    cdef tuple _schedule_waiting(self, _Step step, int64_t budget, double now):
        cdef _KVCache kv = self.kv
        cdef _Pool pool = self.pool
        cdef int64_t block = kv.block_tokens
        cdef double overhead = 0.0, load_done = now, done
        cdef int64_t most = self.p.max_num_seqs
        cdef int64_t limit, local, pool_prefix, external, computed, n, need, used_before
        cdef bint loads_apart
        cdef _Req req
        cdef _Match match
        cdef object waiting = self.waiting
        while waiting and budget > 0 and len(self.running) + len(self.loading) < most:
            req = <_Req>waiting[0]
            limit = req.num_tokens() - 1
            match = kv.match(req, limit // block)
            local = match.blocks * block
            pool_prefix = pool.lookup(req, limit, now, local)
            external = pool_prefix - local if pool_prefix > local else 0
            computed = local + external
            n = min(req.num_tokens() - computed, budget)
            need = cdiv(computed + n, block) - match.blocks
            if need > kv.available_blocks() - match.free_blocks:
                break
            waiting.popleft()
            used_before = kv.used_blocks()
            req.hold = _Hold.__new__(_Hold)
            req.hold.last = kv.root
            kv.acquire(req.hold, match)
            kv.grow(req.hold, need)
            req.computed = computed
            req.prefilling = True
            overhead += hit_overhead_s(self.p, local)
            loads_apart = False
            if external:
                done = pool.load(now, external)
                loads_apart = self.p.async_loads
                if loads_apart:
                    req.ready_at = done
                elif done > load_done:
                    load_done = done
            if not req.admitted:
                req.admitted = True
                req.admitted_s = now
                req.local_hit, req.pool_hit = local, external
                req.kv_blocks_at_admission = used_before
                req.running_at_admission = len(self.running)
                req.waiting_at_admission = len(waiting)
            step.admitted.append(req)
            if loads_apart:
                self.loading.append(req)
                continue
            self.running.append(req)
            req.n = n
            step.work.append(req)
            budget -= n
        return overhead, load_done, budget

    cdef void _preempt(self, _Req req) except *:
        self.kv.release(req.hold)
        req.hold = None
        req.computed = 0
        req.prefilling = True
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    # --- runs of identical steps --------------------------------------------------

    cdef void extend(self, _Step step) except *:
        cdef list decodes = step.sampled
        cdef _Req partial = step.partial
        cdef _Req r
        cdef int64_t extra = (<int64_t>1) << 62, chunk = 0, left
        if not step.steady:
            return
        for item in decodes:
            r = <_Req>item
            left = r.output_tokens - r.generated
            if left < extra:
                extra = left
        if partial is not None:
            chunk = (<_Req>step.work[len(step.work) - 1]).n
            left = (partial.num_tokens() - partial.computed - 1) // chunk
            if left < extra:
                extra = left
        if extra <= 0:
            return
        extra = self._fit_blocks(decodes, partial, chunk, extra)
        if extra <= 0:
            return
        step.delta = run_delta(self.p, len(decodes), chunk, partial is not None)
        step.count = 1 + extra
        step.end = step.boundary(step.count)
        if partial is not None and self.pool.on and partial.pool_stored >= 0:
            self._store_run_chunks(step, partial, chunk)

    cdef int64_t _needed(self, vector[int64_t]& state, _Req partial, bint grows,
                         int64_t chunk, int64_t steps) noexcept:
        cdef int64_t total = 0, grow
        cdef int64_t block = self.kv.block_tokens
        cdef size_t i = 0
        while i < state.size():
            grow = cdiv(state[i] + steps, block) - state[i + 1]
            if grow > 0:
                total += grow
            i += 2
        if grows:
            grow = cdiv(partial.computed + steps * chunk, block) - partial.hold.logical
            if grow > 0:
                total += grow
        return total

    cdef int64_t _fit_blocks(self, list decodes, _Req partial, int64_t chunk, int64_t extra):
        cdef int64_t available = self.kv.available_blocks()
        cdef vector[int64_t] state
        cdef bint grows = partial is not None and partial.hold is not None
        cdef int64_t lo, hi, mid
        cdef _Req r
        for item in decodes:
            r = <_Req>item
            state.push_back(r.computed)
            state.push_back(r.hold.logical if r.hold is not None else 0)
        if self._needed(state, partial, grows, chunk, extra) <= available:
            return extra
        lo, hi = 0, extra
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._needed(state, partial, grows, chunk, mid) <= available:
                lo = mid
            else:
                hi = mid
        return lo

    cdef void _store_run_chunks(self, _Step step, _Req req, int64_t chunk):
        cdef int64_t size = self.pool.chunk_tokens
        cdef int64_t stored = req.pool_stored, done
        cdef int64_t i
        for i in range(1, step.count + 1):
            done = min((req.computed + (i - 1) * chunk) // size, <int64_t>req.npool)
            if done > stored:
                self.pool.store(req.pool_keys + stored, done - stored, step.boundary(i))
                stored = done
        req.pool_stored = stored

    cdef bint truncate(self, _Step step, double at):
        cdef int64_t steps
        if step.count <= 1 or at >= step.end or not step.open:
            return False
        steps = steps_reaching(step.duration, step.delta, at - step.start)
        while steps > 1 and step.boundary(steps - 1) >= at:
            steps -= 1
        while step.boundary(steps) < at:
            steps += 1
        if steps >= step.count:
            return False
        step.count = steps
        step.end = step.boundary(steps)
        return True

    # --- the end of a step ----------------------------------------------------------

    cdef list complete(self, _Step step):
        cdef _KVCache kv = self.kv
        cdef _Pool pool = self.pool
        cdef int64_t block = kv.block_tokens
        cdef int64_t extra = step.count - 1, need, full
        cdef double end = step.end
        cdef bint store = pool.on
        cdef _Req req
        cdef _Hold hold
        if extra:
            for item in step.work:
                req = <_Req>item
                hold = req.hold
                req.computed += extra * req.n
                if req is not step.partial:
                    req.generated += extra
                need = cdiv(req.computed, block) - hold.logical
                if need > 0:
                    kv.grow(hold, need)
        for item in step.work:
            req = <_Req>item
            hold = req.hold
            if hold is None:
                continue
            full = req.computed // block
            if full > hold.cached:
                kv.commit(hold, req, full)
            if store and req.pool_stored >= 0:
                self._store_chunks(req, end)
            if req.generated >= req.output_tokens:
                req.finished = True
                req.finished_s = end
                kv.release(hold)
                req.hold = None
                step.finished.append(req)
        if step.finished:
            self.running = [r for r in self.running if not (<_Req>r).finished]
        return step.finished

    cdef void _store_chunks(self, _Req req, double at):
        cdef _Pool pool = self.pool
        cdef int64_t chunks
        if req.computed >= req.prompt_tokens:
            pool.store(req.pool_keys, req.npool, at)
            req.pool_stored = -1
            return
        chunks = min(req.computed // pool.chunk_tokens, <int64_t>req.npool)
        if chunks > req.pool_stored:
            pool.store(req.pool_keys + req.pool_stored, chunks - req.pool_stored, at)
            req.pool_stored = chunks

    # --- the served simulator's calls ---------------------------------------------

    def abort(self, _Req req):
        """``ReplicaScheduler.abort``: out of the queues, its blocks freed."""
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.loading:
            self.loading.remove(req)
        if req.hold is not None:
            self.kv.release(req.hold)
            req.hold = None
        if req in self.running:
            self.running.remove(req)

    def reset_cache(self):
        """``ReplicaScheduler.reset_cache``: drop the cached blocks nobody holds."""
        self.kv._evict(self.kv.evictable)


# --- every replica and the event queue (cluster.py) -----------------------------------

cdef class Cluster:
    """The compiled twin of :class:`sessiongen.sim.cluster.Cluster`: requests go in by
    :meth:`submit`, each finished one comes out through ``on_finish(result)``,
    ``result`` built by ``make_result`` from its fields (those of
    :class:`sessiongen.sim.virtual.RequestResult`, in order), where both are given.

    For the served simulator (wall time), a ``listener`` hears of each step as
    ``cluster.Listener`` does, the request :meth:`submit` returns can be aborted, and
    ``pool`` (its ``on`` switch, ``clear()``) and ``replicas`` (``running``,
    ``waiting``, ``loading``, ``kv.usage``, ``kv.capacity``, ``reset_cache()``) answer
    as the Python engine's do."""

    cdef Params p
    cdef readonly _Pool pool
    cdef readonly list replicas
    cdef bint collapse
    cdef object on_finish
    cdef object make_result
    cdef object listener
    cdef list _steps
    cdef vector[double] _idle_since
    cdef vector[double] _wake_at
    cdef vector[bint] _waking
    cdef vector[int64_t] _version
    cdef _Heap _heap
    cdef dict _arrivals
    cdef int64_t _seq
    cdef public double now
    cdef public int64_t events
    cdef public int64_t steps
    cdef public int64_t finished

    def __init__(
        self,
        profile,
        *,
        bint shared_cache,
        bint collapse,
        on_finish=None,
        make_result=None,
        listener=None,
    ):
        cdef Params p = Params(profile)
        cdef int i
        self.p = p
        chunk_bytes = profile.pool_chunk_tokens * profile.kv_bytes_per_token
        capacity = max(int(profile.pool_capacity_gib * 2**30) // chunk_bytes, 0)
        self.pool = _Pool(shared_cache, capacity, p)
        from collections import deque

        self.replicas = [
            _Sched(p, self.pool, deque()) for i in range(profile.replicas)
        ]
        self.collapse = collapse
        self.on_finish = on_finish
        self.make_result = make_result
        self.listener = listener
        n = profile.replicas
        self._steps = [None] * n
        self._idle_since.assign(n, -INFINITY)
        self._wake_at.assign(n, 0.0)
        self._waking.assign(n, False)
        self._version.assign(n, 0)
        self._arrivals = {}
        self._heap = _Heap()
        self.now = -INFINITY

    cdef void _push(self, double t, int kind, int replica, int64_t version):
        cdef _Item ev
        ev.key, ev.kind, ev.seq, ev.replica, ev.version = t, kind, self._seq, replica, version
        ev.obj = <PyObject*>NULL
        self._seq += 1
        self._heap.push(ev)

    # --- the driver's side ------------------------------------------------------------

    def submit(
        self,
        double arrival,
        int replica,
        int64_t prompt_tokens,
        int64_t output_tokens,
        head,
        keys,
        pool_keys,
        tag,
        double prefill_scale=1.0,
    ):
        """Queue a request's arrival; ``head`` then ``keys`` (uint64, C-contiguous, the
        two pieces of :attr:`sessiongen.sim.cache.KeyChain.segments`) are its blocks'
        keys as far as known, ``pool_keys`` its prompt's chunk keys; ``prefill_scale``
        multiplies its prefill compute (SimRequest.prefill_scale). Returns the request
        (for :meth:`abort` and its account)."""
        cdef Py_ssize_t own
        cdef _Req req
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError("a request needs at least one prompt and one output token")
        if not 0 <= replica < len(self.replicas):
            raise ValueError(f"replica {replica} outside 0..{len(self.replicas) - 1}")
        req = _Req.__new__(_Req)
        req.tag = tag
        req.replica = replica
        req.prompt_tokens = prompt_tokens
        req.output_tokens = output_tokens
        req.prefill_scale = prefill_scale
        req.head_owner = head
        req.head = _pointer(head, &req.nhead)
        base = head.base
        req.head_owner_len = len(base) if base is not None else req.nhead
        req.keys_owner = keys
        req.keys = _pointer(keys, &own)
        base = keys.base
        req.keys_owner_len = len(base) if base is not None else own
        req.nkeys = req.nhead + own
        req.pool_owner = pool_keys
        req.pool_keys = _pointer(pool_keys, &req.npool)
        req.arrival = arrival
        req.prefilling = True
        self._arrivals[self._seq] = req
        self._push(arrival, 0, replica, 0)
        return req

    def abort(self, _Req req, int replica):
        """Drop a request wherever it is (a pending arrival is skipped when it comes)."""
        (<_Sched>self.replicas[replica]).abort(req)

    def next_time(self):
        """The time of the next event, None when there is none."""
        cdef _Item top
        while self._heap.size():
            top = self._heap.items[0]
            if top.kind == 1 and top.version != self._version[top.replica]:
                self._heap.pop()
                continue
            return top.key
        return None

    def advance(self, double until, bint settle=False):
        """Process every event at or before ``until``, in time order; with ``settle``,
        once a request has finished only the events at its time (Cluster.advance)."""
        cdef _Item ev
        cdef _Req req
        cdef int64_t finished = self.finished
        while self._heap.size() and self._heap.items[0].key <= until:
            ev = self._heap.pop()
            if ev.kind == 1:
                if ev.version == self._version[ev.replica]:
                    if ev.key > self.now:
                        self.now = ev.key
                    self._boundary(ev.replica, ev.key)
            else:
                req = <_Req>self._arrivals.pop(ev.seq)
                if ev.key > self.now:
                    self.now = ev.key
                self._arrive(ev.replica, req, ev.key)
            self.events += 1
            if settle and self.finished != finished and ev.key < until:
                until = ev.key

    cdef void _arrive(self, int r, _Req req, double t) except *:
        cdef _Sched sched = <_Sched>self.replicas[r]
        cdef object current = self._steps[r]
        cdef _Step step
        cdef double wake
        if req.aborted:
            return
        sched.add(req)
        if current is None:
            wake = t if t >= self._idle_since[r] else self._idle_since[r]
            if not self._waking[r] or wake < self._wake_at[r]:
                self._waking[r] = True
                self._wake_at[r] = wake
                self._push_boundary(r, wake)
        else:
            step = <_Step>current
            if step.count > 1 and step.open and sched.truncate(step, t):
                self._push_boundary(r, step.end)

    cdef void _boundary(self, int r, double t) except *:
        cdef _Sched sched = <_Sched>self.replicas[r]
        cdef object current = self._steps[r]
        cdef _Step step, new
        cdef object ready
        cdef double when
        if current is not None:
            step = <_Step>current
            sched.complete(step)
            self._ended(r, step)
        self._waking[r] = False
        new = sched.schedule(t)
        self._steps[r] = new
        if new is None:
            self._idle_since[r] = t
            ready = sched.next_ready()
            if ready is not None:
                when = <double>ready if <double>ready >= t else t
                self._waking[r] = True
                self._wake_at[r] = when
                self._push_boundary(r, when)
            return
        if self.collapse:
            sched.extend(new)
        self._push_boundary(r, new.end)
        if self.listener is not None:
            self.listener.step_started(r, new)

    cdef void _push_boundary(self, int r, double t):
        self._version[r] += 1
        self._push(t, 1, r, self._version[r])

    cdef void _ended(self, int r, _Step step) except *:
        cdef _Req req
        self.steps += step.count
        self.finished += len(step.finished)
        if self.listener is not None:
            self.listener.step_ended(r, step)
        if self.on_finish is None:
            return
        for item in step.finished:
            req = <_Req>item
            result = self.make_result(
                req.tag,
                r,
                req.prompt_tokens,
                req.output_tokens,
                req.arrival,
                req.admitted_s,
                req.first_token_s,
                req.finished_s,
                req.local_hit,
                req.pool_hit,
                req.preemptions,
                req.kv_blocks_at_admission,
                req.running_at_admission,
                req.waiting_at_admission,
            )
            self.on_finish(result)


# --- chain hashing (cache.py) ----------------------------------------------------------

cdef uint64_t _R = 0x9E3779B97F4A7C15ULL
cdef uint64_t _POSITION = 0xD1B54A32D192ED03ULL


cdef inline uint64_t _mix(uint64_t z) noexcept:
    z ^= z >> 30
    z *= 0xBF58476D1CE4E5B9ULL
    z ^= z >> 27
    z *= 0x94D049BB133111EBULL
    z ^= z >> 31
    return z


cdef inline uint64_t _term(uint64_t digest, uint64_t position, uint64_t inv) noexcept:
    """A block's term in a chain's running sum: its tokens' weighted ``digest`` with its
    position in the chain (0-based) added, scrambled, times ``inv`` (``R^-position``)."""
    return _mix(digest + (position + 1) * _POSITION) * inv


cdef inline uint64_t _power(uint64_t base, uint64_t exponent) noexcept:
    cdef uint64_t out = 1
    while exponent:
        if exponent & 1:
            out *= base
        base *= base
        exponent >>= 1
    return out


def chain_hash(
    const uint64_t[::1] before,
    const uint64_t[::1] seq,
    const uint64_t[::1] weights,
    uint64_t scaled,
    uint64_t done,
    uint64_t r_inv,
    uint64_t[::1] out,
):
    """``KeyChain._hash``'s arithmetic for the whole blocks of ``before`` followed by
    ``seq`` (``len(weights)`` tokens each; ``before``, the hashed chain's tail, is shorter
    than a block, so only the first block can straddle the two: nothing is concatenated)
    that follow ``done`` hashed blocks whose running sum is ``scaled``: writes their keys
    to ``out`` and returns the new running sum. Every operation is modulo 2^64, as numpy's
    uint64 arrays compute it, so the keys are the same bits."""
    cdef Py_ssize_t size = weights.shape[0]
    cdef Py_ssize_t ahead = before.shape[0]
    cdef Py_ssize_t blocks = (ahead + seq.shape[0]) // size
    cdef Py_ssize_t j, k
    cdef uint64_t digest, inv = _power(r_inv, done), fwd = _power(_R, done)
    cdef const uint64_t* tokens
    if out.shape[0] < blocks:
        raise ValueError("out: fewer slots than blocks")
    if ahead >= size and blocks:
        raise ValueError("before: a whole block or more")
    for j in range(blocks):
        digest = 0
        if j == 0 and ahead:
            for k in range(ahead):
                digest += before[k] * weights[k]
            for k in range(ahead, size):
                digest += seq[k - ahead] * weights[k]
        else:
            tokens = &seq[j * size - ahead]
            for k in range(size):
                digest += tokens[k] * weights[k]
        scaled += _term(digest, done + <uint64_t>j, inv)
        out[j] = _mix(scaled * fwd)
        inv *= r_inv
        fwd *= _R
    return scaled


# --- a trace's token ids from its hash ids (capacity/prompts.py) -----------------------

cdef uint64_t _SCRAMBLE = 0x9E3779B97F4A7C15ULL


cdef inline uint64_t _trace_id(uint64_t at) noexcept:
    """The id at ``hash id * block_tokens + offset`` of a trace prompt (``block_ids``)."""
    return (at * _SCRAMBLE) >> 40


def trace_tokens(const uint64_t[::1] hash_ids, Py_ssize_t length, uint64_t block_tokens,
                 uint64_t[::1] out):
    """``capacity.prompts.block_ids``' token ids written to ``out[:length]``: token ``p``
    of block ``h`` is ``((h * block_tokens + p) * scramble) >> 40``, modulo 2^64 as numpy
    computes it, in one pass instead of five array operations."""
    cdef Py_ssize_t i, b = 0, p = 0
    cdef uint64_t base
    if length > out.shape[0] or length > hash_ids.shape[0] * <Py_ssize_t>block_tokens:
        raise ValueError("length: more tokens than out or the hash ids hold")
    if length == 0:
        return
    base = hash_ids[0] * block_tokens
    for i in range(length):
        out[i] = _trace_id(base + <uint64_t>p)
        p += 1
        if p == <Py_ssize_t>block_tokens:
            p = 0
            b += 1
            if b < hash_ids.shape[0]:
                base = hash_ids[b] * block_tokens


# --- a trace prompt's keys, each distinct trace block hashed once (cache.py) -----------

cdef struct _Memo:
    uint64_t position  # the trace block's index in its prompt
    uint64_t previous  # the hash id before it where its keys read it, else 0
    uint64_t hash_id
    Py_ssize_t terms  # where its blocks' terms start in TraceKeys.terms
    Py_ssize_t next  # the next entry under the same map key, -1 for none


#: What one kept trace block costs besides its terms, in 8-byte words: its 40-byte entry
#: and its index's hash-map node (key, value, link, cached hash).
cdef Py_ssize_t _ENTRY_WORDS = 9


cdef inline uint64_t _memo_key(uint64_t position, uint64_t previous, uint64_t hash_id) noexcept:
    return _mix(_mix(hash_id + _POSITION) ^ _mix(previous * _R + position))


cdef class TraceKeys:
    """The keys of trace prompts that all extend one hashed chain (the chat template's
    head, in the planner), as ``KeyChain.extend_trace`` asks for them: the same bits
    :func:`chain_hash` gives for the chain's tail (``before``) followed by
    :func:`trace_tokens`' ids and ``after``, without making the ids.

    A block's term in the chain's running sum (its scrambled digest times ``R^-m``,
    ``m`` its position in the chain) depends only on its tokens and ``m``. The trace
    block size is a whole number of blocks, so the blocks that end inside trace block
    ``i`` are always the same ``per`` blocks, at the same positions, and their tokens
    are that trace block's ids (and, when ``before`` is not empty, the last few of the
    trace block before it): their terms are computed the first time
    ``(i, previous hash id, hash id)`` is seen and added up from then on. A trace's
    later turns repeat their earlier turns' hash ids, and conversations share system
    prompts: the Mooncake-shaped bench trace has 278k full trace blocks, 72k distinct.
    Blocks past the last full trace block (its partial tail, ``after``) are hashed
    token by token, as :func:`chain_hash` does. What is kept is bounded by ``limit``
    words of 8 bytes (64 MiB by default): a trace block's terms and its entry (the
    entry and its index node counted as :data:`_ENTRY_WORDS`); past that, new trace
    blocks are hashed and not kept. ``chain`` names the chain it was made for (its
    blocks, running sum and tail length) so that it is not used for another.
    """

    cdef vector[uint64_t] before
    cdef vector[uint64_t] after
    cdef vector[uint64_t] ids
    cdef vector[uint64_t] weights
    cdef vector[uint64_t] terms
    cdef vector[uint64_t] scratch
    cdef vector[uint64_t] rest
    cdef vector[_Memo] entries
    cdef unordered_map[uint64_t, Py_ssize_t] index
    cdef uint64_t done, r_inv, trace_block, scaled
    cdef Py_ssize_t size, per, limit, words

    def __init__(
        self,
        const uint64_t[::1] before,
        const uint64_t[::1] after,
        const uint64_t[::1] weights,
        uint64_t done,
        uint64_t scaled,
        uint64_t r_inv,
        uint64_t trace_block,
        Py_ssize_t limit=1 << 23,
    ):
        cdef Py_ssize_t k
        self.size = weights.shape[0]
        if self.size == 0 or trace_block == 0 or trace_block % <uint64_t>self.size:
            raise ValueError("trace_block: not a whole number of blocks")
        if before.shape[0] >= self.size:
            raise ValueError("before: a whole block or more")
        for k in range(before.shape[0]):
            self.before.push_back(before[k])
        for k in range(self.size):
            self.weights.push_back(weights[k])
        for k in range(after.shape[0]):
            self.after.push_back(after[k])
        self.done, self.scaled, self.r_inv, self.trace_block = done, scaled, r_inv, trace_block
        self.per = <Py_ssize_t>(trace_block // <uint64_t>self.size)
        self.limit = limit
        self.scratch.resize(self.per)

    @property
    def stored(self):
        """How many trace blocks' terms are kept."""
        return self.entries.size()

    @property
    def chain(self):
        """(blocks, running sum, tail tokens) of the chain it was made for."""
        return self.done, self.scaled, self.before.size()

    @property
    def after_tokens(self):
        """How many tokens ``after`` is (every prompt ends with them)."""
        return self.after.size()

    cdef const uint64_t* _terms(self, const uint64_t* hash_ids, Py_ssize_t i) except NULL:
        """The ``per`` terms of the blocks ending in full trace block ``i``."""
        cdef Py_ssize_t a = self.before.size()
        cdef uint64_t previous = hash_ids[i - 1] if (a and i) else 0
        cdef uint64_t hid = hash_ids[i], key = _memo_key(<uint64_t>i, previous, hid)
        cdef unordered_map[uint64_t, Py_ssize_t].iterator found = self.index.find(key)
        cdef Py_ssize_t at = -1, k, x, start = 0, entry_at
        cdef uint64_t start_at
        cdef _Memo* entry
        if found != self.index.end():
            at = deref(found).second
            while at >= 0:
                entry = &self.entries[at]
                if entry.position == <uint64_t>i and entry.previous == previous \
                        and entry.hash_id == hid:
                    return &self.terms[entry.terms]
                at = entry.next
        cdef uint64_t* out
        cdef bint keep = self.words + self.per + _ENTRY_WORDS <= self.limit
        if keep:
            start = self.terms.size()
            self.terms.resize(start + self.per)
            out = &self.terms[start]
        else:
            out = &self.scratch[0]
        cdef uint64_t block = self.trace_block, size = self.size
        cdef uint64_t m = self.done + <uint64_t>(i * self.per)
        cdef uint64_t inv = _power(self.r_inv, m), digest, base = hid * block
        cdef uint64_t before_base = hash_ids[i - 1] * block + block - <uint64_t>a if i else 0
        cdef const uint64_t* w = &self.weights[0]
        for k in range(self.per):
            digest = 0
            if k == 0 and a:  # the block starts in the trace block before, or in ``before``
                for x in range(a):
                    if i:
                        digest += _trace_id(before_base + <uint64_t>x) * w[x]
                    else:
                        digest += self.before[x] * w[x]
                for x in range(a, self.size):
                    digest += _trace_id(base + <uint64_t>(x - a)) * w[x]
            else:
                start_at = base + <uint64_t>(k * self.size - a)
                for x in range(self.size):
                    digest += _trace_id(start_at + <uint64_t>x) * w[x]
            out[k] = _term(digest, m, inv)
            inv *= self.r_inv
            m += 1
        if keep:
            entry_at = self.entries.size()
            self.entries.push_back(_Memo(<uint64_t>i, previous, hid, start, -1))
            if found != self.index.end():  # chain it in front of the others
                self.entries[entry_at].next = deref(found).second
            self.index[key] = entry_at
            self.words += self.per + _ENTRY_WORDS
        return out

    def keys(
        self,
        object hash_ids,
        Py_ssize_t length,
        uint64_t scaled,
        uint64_t[::1] out,
        Py_ssize_t at,
        uint64_t[::1] tail,
    ):
        """Writes the keys of the whole blocks of ``before``, the trace prompt
        ``(hash_ids, length)`` (the ids a sequence of ints, each below 2^64) and
        ``after`` to ``out[at:]`` and the tokens past them to ``tail`` (exactly as
        long); returns the running sum (``scaled``: the chain's)."""
        cdef Py_ssize_t a = self.before.size(), size = self.size
        cdef Py_ssize_t block = <Py_ssize_t>self.trace_block
        cdef Py_ssize_t total = a + length + <Py_ssize_t>self.after.size()
        cdef object hid
        self.ids.clear()
        for hid in hash_ids:  # as numpy's uint64 conversion: OverflowError outside it
            self.ids.push_back(<uint64_t>hid)
        cdef Py_ssize_t blocks = total // size
        cdef Py_ssize_t full = length // block
        cdef Py_ssize_t i, j = 0, k, x, q, t, b, p, n
        cdef uint64_t fwd = _power(_R, self.done), inv, digest, base
        cdef const uint64_t* terms
        cdef const uint64_t* ids = self.ids.data()
        cdef const uint64_t* w = &self.weights[0]
        cdef uint64_t* keys
        cdef uint64_t* rest
        if length < 0 or length > <Py_ssize_t>self.ids.size() * block:
            raise ValueError("length: more tokens than the hash ids hold")
        if at < 0 or out.shape[0] < at + blocks:
            raise ValueError("out: fewer slots than blocks")
        if tail.shape[0] != total - blocks * size:
            raise ValueError("tail: not as long as the tokens past the last whole block")
        keys = &out[at] if blocks else NULL
        for i in range(full):
            terms = self._terms(ids, i)
            for k in range(self.per):
                scaled += terms[k]
                keys[j] = _mix(scaled * fwd)
                fwd *= _R
                j += 1
        # The rest (the partial trace block, ``after``), from the first block not
        # summed: its ids made in order into the scratch buffer, then hashed.
        q = j * size
        n = total - q
        if <Py_ssize_t>self.rest.size() < n:
            self.rest.resize(n)
        rest = self.rest.data() if n else NULL
        x = 0
        while q + x < a:  # only before the first trace block: ``before`` itself
            rest[x] = self.before[q + x]
            x += 1
        t = q + x - a  # the first trace position, if any
        if t < length:
            b, p = t // block, t % block
            base = ids[b] * <uint64_t>block
            while t < length:
                rest[x] = _trace_id(base + <uint64_t>p)
                x += 1
                t += 1
                p += 1
                if p == block and t < length:
                    p = 0
                    b += 1
                    base = ids[b] * <uint64_t>block
        for k in range(<Py_ssize_t>self.after.size()):  # the rest starts before a + length
            rest[x] = self.after[k]
            x += 1
        inv = _power(self.r_inv, self.done + <uint64_t>j)
        x = 0
        while j < blocks:
            digest = 0
            for k in range(size):
                digest += rest[x + k] * w[k]
            scaled += _term(digest, self.done + <uint64_t>j, inv)
            keys[j] = _mix(scaled * fwd)
            inv *= self.r_inv
            fwd *= _R
            j += 1
            x += size
        for k in range(total - blocks * size):
            tail[k] = rest[x + k]
        return scaled
