#!/usr/bin/env bash
# Install one published SGLang release into its own directory, for tests that run that release's real code.
#
# Usage: hack/install-sglang-release.sh VERSION [PYTHON]
#        (PYTHON defaults to .venv/bin/python of this repo; the directory is printed on success)
#
# The release goes to $PDFLEET_CACHE (default ~/.cache/pdfleet)/sglang-VERSION with `pip install --no-deps --target`:
# only SGLang's own wheel (about 4 MB, 40 MB unpacked). Tests put that directory first on PYTHONPATH of a
# subprocess of .venv's python, so `import sglang` finds this release while torch, transformers and the other
# dependencies come from the main install (hack/install-sglang.sh). That is enough to import and run the
# detokenizer; nothing here can run a model. A directory whose import check passes is kept (a second run takes
# about a second); a broken or partial one is replaced.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${1:?usage: hack/install-sglang-release.sh VERSION [PYTHON]}"
PY="${2:-$ROOT/.venv/bin/python}"
CACHE="${PDFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pdfleet}"
DEST="$CACHE/sglang-$VERSION"

die() {
    echo "install-sglang-release: ERROR: $*" >&2
    exit 1
}
say() { echo "install-sglang-release: $*"; }

[ -x "$PY" ] || die "no python at '$PY' (run 'make venv' first, or pass the venv's python as \$2)"

# The version the directory's own sglang reports, read from its metadata: importing sglang here would need the
# same stand-ins the tests install, and the metadata is what pip wrote.
installed_version() {
    "$PY" - "$DEST" <<'PYEOF' 2>/dev/null
import importlib.metadata as md
import sys

dists = [d for d in md.distributions(path=[sys.argv[1]]) if d.metadata["Name"] == "sglang"]
print(dists[0].version if dists else "")
PYEOF
}

if [ -d "$DEST" ] && [ "$(installed_version)" = "$VERSION" ] && [ -f "$DEST/sglang/srt/managers/detokenizer_manager.py" ]; then
    say "sglang $VERSION already installed in $DEST; nothing to do"
    exit 0
fi

rm -rf "$DEST" "$DEST.partial"
mkdir -p "$CACHE"
start=$(date +%s)
if ! "$PY" -m pip install --disable-pip-version-check -q --no-deps --only-binary=:all: \
        --target "$DEST.partial" "sglang==$VERSION"; then
    rm -rf "$DEST.partial"
    die "pip install --no-deps sglang==$VERSION failed (see pip's message above; it needs PyPI)"
fi
mv "$DEST.partial" "$DEST"
have="$(installed_version)"
[ "$have" = "$VERSION" ] || die "$DEST holds sglang '$have' after installing $VERSION"
say "sglang $VERSION installed in $DEST in $(($(date +%s) - start)) s"
