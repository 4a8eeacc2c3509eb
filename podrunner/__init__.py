"""`pdfleet-sim`: the pod runner of the local cluster. It plays kubelet for pdfleet's own pods on the fake
nodes, running what each pod would run, bound to the pod's loopback IP (see docs/local-fleet.md)."""
