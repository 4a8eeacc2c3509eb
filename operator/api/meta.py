"""Names of the API: group, version, kind. Our own group, never the Gateway API's
`inference.networking.k8s.io`, which has an unrelated kind also called InferencePool."""

from typing import Final

GROUP: Final = "pdfleet.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "InferencePool"
LIST_KIND: Final = "InferencePoolList"
PLURAL: Final = "inferencepools"
SINGULAR: Final = "inferencepool"
SHORT_NAMES: Final = ("pdpool",)
CATEGORIES: Final = ("pdfleet",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
