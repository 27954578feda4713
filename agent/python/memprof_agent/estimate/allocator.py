"""A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp),
replayed over a trace of storage allocations and frees, so that a fake run
yields the two numbers the real one reports: peak allocated (block sizes,
after rounding) and peak reserved (segments taken from the driver).

Modelled rules, as in the allocator's source:
- every request is rounded up to a multiple of 512 B (the minimum block);
- requests of at most 1 MiB come from the small pool, in 2 MiB segments;
- larger requests come from the large pool: under 10 MiB in a 20 MiB
  segment, otherwise a segment of the request rounded up to 2 MiB;
- a free block is reused best-fit within its pool; a block is split when
  the rest is at least 512 B (small pool) or over 1 MiB (large pool), else
  handed out whole (and counted whole in allocated);
- freed neighbours in a segment merge; segments are never returned (no
  empty_cache), so reserved only grows.
Not modelled: streams, expandable segments, max_split_size_mb, garbage
collection thresholds, and the retry after an OOM that frees the cache.
"""

import bisect

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_SEGMENT = 2 << 20
MIN_LARGE_ALLOC = 10 << 20
LARGE_SEGMENT = 20 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes):
    """The block size a request of `nbytes` gets: 512 B at least, then a multiple of 512 B."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(rounded):
    """How much a new segment for a block of `rounded` bytes takes from the driver."""
    if rounded <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-rounded // ROUND_LARGE) * ROUND_LARGE


def should_split(block_size, rounded):
    """Whether the rest of a block after `rounded` bytes becomes a free block of its own."""
    rest = block_size - rounded
    if rounded <= SMALL_SIZE:
        return rest >= MIN_BLOCK
    return rest > SMALL_SIZE


class CachingAllocator:
    """Replays alloc/free by key; `peak_allocated` and `peak_reserved` are the answers."""

    def __init__(self):
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0
        self.segments = 0
        # pool ("small"/"large") -> sorted [(size, segment, offset)] of free blocks
        self._free = {"small": [], "large": []}
        self._free_at = {}  # (segment, offset) -> size, free blocks by start
        self._free_end = {}  # (segment, end) -> offset, free blocks by end
        self._pool = {}  # segment -> pool
        self._live = {}  # key -> (segment, offset, size)

    def alloc(self, key, nbytes):
        """A storage of `nbytes` is born under `key`."""
        rounded = round_size(nbytes)
        pool = "small" if rounded <= SMALL_SIZE else "large"
        found = self._take_free(pool, rounded)
        if found is None:
            found = self._new_segment(pool, rounded)
        segment, offset, size = found
        size = self._split(pool, segment, offset, size, rounded)
        self._live[key] = (segment, offset, size)
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key):
        """The storage under `key` dies; an unknown key is ignored (born before tracking)."""
        entry = self._live.pop(key, None)
        if entry is None:
            return
        segment, offset, size = entry
        self.allocated -= size
        offset, size = self._merge(segment, offset, size)
        self._add_free(segment, offset, size)

    def _add_free(self, segment, offset, size):
        bisect.insort(self._free[self._pool[segment]], (size, segment, offset))
        self._free_at[(segment, offset)] = size
        self._free_end[(segment, offset + size)] = offset

    def _remove_free(self, segment, offset, size):
        free = self._free[self._pool[segment]]
        del free[bisect.bisect_left(free, (size, segment, offset))]
        del self._free_at[(segment, offset)]
        del self._free_end[(segment, offset + size)]

    def _take_free(self, pool, rounded):
        free = self._free[pool]
        i = bisect.bisect_left(free, (rounded, -1, -1))
        if i == len(free):
            return None
        size, segment, offset = free[i]
        self._remove_free(segment, offset, size)
        return segment, offset, size

    def _new_segment(self, pool, rounded):
        size = segment_size(rounded)
        segment = self.segments
        self.segments += 1
        self._pool[segment] = pool
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return segment, 0, size

    def _split(self, pool, segment, offset, size, rounded):
        if not should_split(size, rounded):
            return size
        self._add_free(segment, offset + rounded, size - rounded)
        return rounded

    def _merge(self, segment, offset, size):
        after = self._free_at.get((segment, offset + size))
        if after is not None:
            self._remove_free(segment, offset + size, after)
            size += after
        before = self._free_end.get((segment, offset))
        if before is not None:
            b_size = self._free_at[(segment, before)]
            self._remove_free(segment, before, b_size)
            offset, size = before, b_size + size
        return offset, size


def replay(events):
    """Peak allocated and reserved bytes of a trace of ("alloc", key, nbytes) / ("free", key)."""
    a = CachingAllocator()
    for event in events:
        if event[0] == "alloc":
            a.alloc(event[1], event[2])
        else:
            a.free(event[1])
    return a
