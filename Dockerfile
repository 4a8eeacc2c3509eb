# syntax=docker/dockerfile:1
# The pdfleet operator image: `docker build -t pdfleet-operator:0.1.0 .`
#
# Not built in this repository's development environment (it has no Docker engine), so keep it simple: a build
# stage installs pdfleet with the `operator` extra into a virtual environment, and the final stage copies only
# that environment onto the same slim Python base. No compilers or build tools reach the final image (every
# dependency ships a manylinux wheel), and it runs as the non-root user 65532 that the Helm chart requires.
# Pin the base image by digest (python:3.11-slim@sha256:...) when publishing.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# .dockerignore admits only what the package is built from.
COPY . .
RUN python -m venv /opt/pdfleet \
 && /opt/pdfleet/bin/pip install '.[operator]'

FROM python:3.11-slim
LABEL org.opencontainers.image.title="pdfleet-operator" \
      org.opencontainers.image.description="Kubernetes operator for SGLang prefill/decode disaggregated fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/pdfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
COPY --from=build /opt/pdfleet /opt/pdfleet
USER 65532:65532
# health (/healthz, /readyz) and metrics (/metrics)
EXPOSE 8080 9090
ENTRYPOINT ["pdfleet-operator"]
