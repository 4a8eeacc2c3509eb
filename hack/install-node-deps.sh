#!/usr/bin/env bash
# Installs the Debian packages the local cluster's real node needs (hack/realnode.py), if any is missing:
# containerd and runc run its containers, the CNI plugins give pods their network, docker-registry and skopeo
# hold and copy images, catatonit is its sandbox (pause) process. PDFLEET_REAL_NODE=0 needs none of them.
set -euo pipefail
[ "${PDFLEET_REAL_NODE:-1}" = 0 ] && exit 0
want=(containerd runc containernetworking-plugins docker-registry skopeo catatonit)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-node-deps: the real node needs these Debian packages: ${missing[*]}." >&2
  echo "Install them as root (apt-get install ${missing[*]}), or leave the node out: PDFLEET_REAL_NODE=0." >&2
  exit 1
fi
echo "install-node-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
# The packages' own services are not wanted: the node starts its containerd and registry itself.
for svc in containerd docker-registry; do
  if command -v systemctl >/dev/null && systemctl is-active -q "$svc" 2>/dev/null; then systemctl disable --now -q "$svc"; fi
done
