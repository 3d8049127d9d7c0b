"""radix: the prefix cache. A radix tree over KV slot indices, and the slot allocator under it.

Imports nothing else from the project (the README's tour says how the packages layer).
"""

from radix.allocator import SlotAllocator
from radix.base import BasePrefixCache, MatchResult
from radix.no_cache import NoPrefixCache
from radix.radix_cache import CacheStats, RadixCache, TreeNode

__all__ = ["BasePrefixCache", "CacheStats", "MatchResult", "NoPrefixCache", "RadixCache", "SlotAllocator", "TreeNode"]
