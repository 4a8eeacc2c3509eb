"""The chart release the end-to-end tests install, and the identity the operator runs under: the first shared
operator's (tests/support/scheduling.py; the second runs as release pdfleet-b, its ServiceAccount named so)."""

RELEASE_NAMESPACE = "pdfleet-system"
SERVICE_ACCOUNT = "pdfleet"
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{SERVICE_ACCOUNT}"
