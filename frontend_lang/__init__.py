"""radixserve: frontend_lang package."""
