"""Micro-benchmark of the radix cache: match / insert / evict per operation with 100k cached sequences.

    python -m benchmarks.radix_ops [--sequences 100000]
"""

from __future__ import annotations

import argparse
import random
import time

from radix import RadixCache, SlotAllocator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sequences", type=int, default=100_000)
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--page-size", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    prefixes = [[rng.randrange(32000) for _ in range(args.length // 2)] for _ in range(100)]
    seqs = [rng.choice(prefixes) + [rng.randrange(32000) for _ in range(args.length // 2)]
            for _ in range(args.sequences)]
    alloc = SlotAllocator(args.sequences * args.length, args.page_size)
    cache = RadixCache(alloc, args.page_size)

    start = time.perf_counter()
    for seq in seqs:
        slots = alloc.alloc(len(seq))
        k = cache.insert(seq, slots)
        alloc.free(slots[:k])
    insert_us = (time.perf_counter() - start) / len(seqs) * 1e6

    probes = rng.sample(seqs, 10_000)
    start = time.perf_counter()
    for seq in probes:
        cache.match_prefix(seq)
    match_us = (time.perf_counter() - start) / len(probes) * 1e6

    start = time.perf_counter()
    rounds = 1000
    for _ in range(rounds):
        cache.evict(args.length)
    evict_us = (time.perf_counter() - start) / rounds * 1e6
    print(f"{args.sequences} sequences of {args.length} tokens (page size {args.page_size}), "
          f"{cache.total_size()} tokens cached after evictions")
    print(f"insert  {insert_us:8.1f} us/op")
    print(f"match   {match_us:8.1f} us/op")
    print(f"evict   {evict_us:8.1f} us/op  (freeing {args.length} tokens: {rounds} rounds)")


if __name__ == "__main__":
    main()
