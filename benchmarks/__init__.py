"""Benchmarks: workloads, the offline comparison, the serving load generator, peers and plots."""
