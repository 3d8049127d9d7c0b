"""radixserve: kernels package."""
