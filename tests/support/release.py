"""The chart release the end-to-end tests install, and the identity the operator runs under."""

RELEASE_NAMESPACE = "pdfleet-system"
SERVICE_ACCOUNT = "pdfleet"
OPERATOR_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{SERVICE_ACCOUNT}"
