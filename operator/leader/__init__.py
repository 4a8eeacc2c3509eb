"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics (docs/architecture.md).

`decision` is pure (what to do, given the Lease observed and the time); `lease` reads and writes the Lease;
`elector` runs the acquire, renew and release loop that `__main__` wires around kopf.
"""
