"""radixserve: server package."""
