"""pdfleet runtime: runs inside engine pods (launcher, patches, rank health)."""
