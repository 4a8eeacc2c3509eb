"""pdfleet kernels: bf16 index-key indexer kernels."""
