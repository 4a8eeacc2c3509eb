"""`pdfleet`, the command line for people: `report` (pure: what is printed, exit codes), `kube` (the reads),
`__main__` (wiring)."""
