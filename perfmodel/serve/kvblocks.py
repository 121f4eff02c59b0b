"""KV-cache blocks of one replica, with vLLM v1's prefix caching (vllm/v1/core/block_pool.py, kv_cache_utils.py).

A request holds ``private`` blocks (its own tokens) and ``shared`` cached blocks (full blocks of a prompt prefix it
shares with its prefix group). A full block of a group's prefix is identified by (group, block index): vLLM's
chained block hash, since the tokens before it are the same prefix. Blocks whose reference count drops to zero stay
cached and evictable in LRU order (a freed request's blocks are queued tail block first, so they are evicted
first, as vLLM's ``free``); an allocation takes never-used or plainly freed blocks first, then evicts the least
recently used cached ones (vLLM takes the head of one free queue; the order differs only in which cached block goes
first when uncached freed blocks are also waiting). A hit is the longest run of a group's leading blocks in the
cache, capped so that at least one prompt token is recomputed (vLLM needs its logits).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        #: Blocks held by nobody and caching nothing.
        self.plain_free = num_blocks
        #: Cached blocks: key -> reference count.
        self.refs: dict[Hashable, int] = {}
        #: Cached blocks with no reference, least recently used first.
        self.evictable: OrderedDict[Hashable, None] = OrderedDict()
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def free_blocks(self) -> int:
        return self.plain_free + len(self.evictable)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def take(self, n: int) -> bool:
        """Allocate ``n`` new private blocks; False (nothing taken) when fewer are free."""
        if n <= 0:
            return True
        if n > self.plain_free + len(self.evictable):
            return False
        plain = min(n, self.plain_free)
        self.plain_free -= plain
        for _ in range(n - plain):
            key, _ = self.evictable.popitem(last=False)
            del self.refs[key]
        return True

    def give_back(self, private: int, shared: list) -> None:
        """Release a request's blocks: private ones become plain free, shared ones lose a reference."""
        self.plain_free += private
        for key in reversed(shared):
            left = self.refs[key] - 1
            self.refs[key] = left
            if left == 0:
                self.evictable[key] = None

    def lookup(self, group: str | None, prefix_blocks: int, total_tokens: int) -> list:
        """Keys of the longest run of ``group``'s leading cached blocks usable for a request of ``total_tokens``
        (at most ``(total_tokens - 1) // block_size`` blocks). Touches and counts nothing."""
        if not self.prefix_caching or group is None:
            return []
        cap = min(prefix_blocks, (total_tokens - 1) // self.block_size)
        keys = []
        for j in range(cap):
            key = (group, j)
            if key not in self.refs:
                break
            keys.append(key)
        return keys

    def admitted(self, total_tokens: int, keys: list) -> None:
        """Count an admitted request's query (its tokens) and hit (its cached blocks) for the hit rate."""
        self.query_tokens += total_tokens
        self.hit_tokens += len(keys) * self.block_size

    def touch(self, keys: list) -> None:
        """Take a reference on each cached block of a hit (removing it from the evictable queue)."""
        for key in keys:
            if self.refs[key] == 0:
                del self.evictable[key]
            self.refs[key] += 1

    def untouch(self, keys: list) -> None:
        """Undo :meth:`touch` of a request that could not be scheduled after all."""
        for key in reversed(keys):
            self.refs[key] -= 1
            if self.refs[key] == 0:
                self.evictable[key] = None

    def publish(self, key: Hashable) -> bool:
        """Make a full private block of a prefix cacheable under ``key`` (its holder keeps one reference);
        False when the key is already cached (the block stays private)."""
        if not self.prefix_caching or key in self.refs:
            return False
        self.refs[key] = 1
        return True
