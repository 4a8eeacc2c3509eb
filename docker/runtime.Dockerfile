# syntax=docker/dockerfile:1
# pdfleet's runtime image: what the engine pods' init container copies into their shared volume.
#   docker build -f docker/runtime.Dockerfile -t pdfleet-runtime:0.1.0 .
#
# The engine container runs the user's SGLang image and its Python; this image only carries pdfleet's runtime
# (`pdfleet.runtime`: launcher, patches, instrumentation, rank-health agent, drain; standard library only) and the
# indexer kernels (`pdfleet.kernels`, imported by the bf16-index-keys patch inside the engine, where SGLang's torch
# and Triton are), laid out exactly as `python -m pdfleet.runtime.install` lays them out. The build stage runs that installer;
# the final stage is busybox, since copying a directory tree needs no Python. Its `pdfleet-install-runtime
# DEST` (the init container's command) copies the tree into DEST/lib, written beside and renamed into place as
# the Python installer does. Runs as 65532, read-only root filesystem friendly (writes only to DEST).
# Not built in this repository's development environment (no Docker engine); pin both bases by digest when
# publishing.

FROM python:3.11-slim AS build
WORKDIR /src
# Only the runtime and the kernels: docker/runtime.Dockerfile.dockerignore keeps the operator and tests out.
COPY runtime/ pdfleet/runtime/
COPY kernels/ pdfleet/kernels/
RUN PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/src python3 -S -m pdfleet.runtime.install /out \
 && PYTHONPATH=/out/lib python3 -S -m pdfleet.runtime.launcher patches > /dev/null \
 && test ! -e /out/lib/pdfleet/__init__.py

FROM busybox:1.36
LABEL org.opencontainers.image.title="pdfleet-runtime" \
      org.opencontainers.image.description="pdfleet's engine-pod runtime, copied into SGLang pods by an init container" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/lib /opt/pdfleet-runtime/lib
COPY --chmod=0755 <<'SH' /usr/local/bin/pdfleet-install-runtime
#!/bin/sh
# pdfleet-install-runtime DEST: put pdfleet's runtime in DEST/lib (PYTHONPATH=DEST/lib in the engine container).
set -eu
dest="${1:?usage: pdfleet-install-runtime DEST}"
mkdir -p "$dest/lib/pdfleet"
for name in kernels runtime; do
  rm -rf "$dest/lib/pdfleet/.$name.new" "$dest/lib/pdfleet/.$name.old"
  cp -R "/opt/pdfleet-runtime/lib/pdfleet/$name" "$dest/lib/pdfleet/.$name.new"
  if [ -e "$dest/lib/pdfleet/$name" ]; then mv "$dest/lib/pdfleet/$name" "$dest/lib/pdfleet/.$name.old"; fi
  mv "$dest/lib/pdfleet/.$name.new" "$dest/lib/pdfleet/$name"
  rm -rf "$dest/lib/pdfleet/.$name.old"
done
echo "pdfleet-install-runtime: runtime installed in $dest/lib/pdfleet/runtime" >&2
SH
USER 65532:65532
ENTRYPOINT ["pdfleet-install-runtime"]
CMD ["/opt/pdfleet"]
