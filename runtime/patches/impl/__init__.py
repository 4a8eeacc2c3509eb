"""Implementations of catalogue patches, one module per patch id (see `patches.registry.MODULES`)."""
