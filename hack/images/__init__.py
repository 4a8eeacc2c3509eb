"""`make images`: pdfleet's container images built without a daemon (docs/images.md).

`python -m hack.images build [NAME...]` builds the operator, runtime and CPU engine images as OCI archives under
$PDFLEET_CACHE/images (default ~/.cache/pdfleet/images), indexed in images/index.json; `lock` regenerates
requirements/operator.lock; `run NAME -- ARGS` runs a built image with runc.
"""
