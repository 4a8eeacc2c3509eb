#!/usr/bin/env bash
# Publishes the images `make images` built, and says how to install exactly them. Run by
# .github/workflows/release.yml on a version tag (docs/releasing.md); runnable by hand with a registry login.
#
#   hack/publish-images.sh check-version TAG
#       TAG (v0.1.0) must be the package's version (pyproject.toml) and the chart's version and appVersion.
#   hack/publish-images.sh push INDEX REGISTRY TAG OUT
#       Pushes each archive the images index INDEX (~/.cache/pdfleet/images/index.json) names, of the images in
#       $PUBLISH_IMAGES (default: pdfleet-operator pdfleet-runtime), to REGISTRY/<name>:TAG with skopeo, keeping
#       its digests: the digest pushed is the manifest digest inside the archive, or the script fails. Writes
#       OUT: a JSON list of {name, repository, tag, digest}.
#   hack/publish-images.sh notes OUT CERT_IDENTITY
#       Release notes (markdown) from OUT: the chart values that pin both images by digest, and the cosign
#       command that verifies each signature (CERT_IDENTITY: the signing workflow's URL and ref, as Fulcio's
#       certificate names it: https://github.com/OWNER/REPO/.github/workflows/release.yml@refs/tags/TAG).
#
# The images index: a JSON document in which every object with an "archive" key (a path to an oci-archive,
# relative to the index's folder or absolute) is an image. Its name is the last path component of the reference
# the archive itself carries (the io.containerd.image.name annotation of its index.json), less the tag, or the
# object's "name" when the archive carries none.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SKOPEO="${SKOPEO:-skopeo}"
PYTHON="${PYTHON:-python3}"

die() { echo "publish-images: $*" >&2; exit 1; }
say() { echo "publish-images: $*" >&2; }

check_version() {
  local tag="$1"
  "$PYTHON" - "$ROOT" "$tag" <<'EOF'
import pathlib, re, sys, tomllib
root, tag = pathlib.Path(sys.argv[1]), sys.argv[2]
package = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
chart = {k: v.strip().strip('"') for k, _, v in (line.partition(":") for line in
         (root / "charts/pdfleet/Chart.yaml").read_text().splitlines()) if k in ("version", "appVersion")}
if not re.fullmatch(r"v\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?", tag):
    sys.exit(f"publish-images: {tag!r} is not a version tag (v1.2.3)")
wrong = [f"{what} is {have}" for what, have in (("pyproject.toml's version", package),
         ("the chart's version", chart.get("version")), ("the chart's appVersion", chart.get("appVersion")))
         if have != tag[1:]]
if wrong:
    sys.exit(f"publish-images: tag {tag} does not match: {'; '.join(wrong)}. Bump them together, then tag.")
EOF
}

# name<TAB>archive<TAB>manifest digest, one line per image of the index.
list_images() {
  "$PYTHON" - "$1" <<'EOF'
import json, pathlib, sys, tarfile
index = pathlib.Path(sys.argv[1])
def entries(node):
    if isinstance(node, dict):
        if "archive" in node:
            yield node
        else:
            for value in node.values():
                yield from entries(value)
    elif isinstance(node, list):
        for value in node:
            yield from entries(value)
found = list(entries(json.loads(index.read_text())))
if not found:
    sys.exit(f"publish-images: {index} names no image (no object with an 'archive')")
for entry in found:
    archive = (index.parent / entry["archive"]).resolve()
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        (manifest,) = json.load(member)["manifests"]
    ref = (manifest.get("annotations") or {}).get("io.containerd.image.name") or entry.get("name") or ""
    name = ref.rsplit("/", 1)[-1].split("@")[0].split(":")[0]
    if not name:
        sys.exit(f"publish-images: {archive}: no image name in the archive or the index")
    print(f"{name}\t{archive}\t{manifest['digest']}")
EOF
}

push() {
  local index="$1" registry="${2%/}" tag="$3" out="$4"
  [ -f "$index" ] || die "$index: no images index (run make images first)"
  local wanted="${PUBLISH_IMAGES:-pdfleet-operator pdfleet-runtime}" listing name archive digest pushed
  listing="$(list_images "$index")"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  : >"$tmp/published.tsv"
  for want in $wanted; do
    if ! grep -q "^${want}	" <<<"$listing"; then
      die "$index has no image $want (it has: $(cut -f1 <<<"$listing" | tr '\n' ' '))"
    fi
    IFS=$'\t' read -r name archive digest < <(grep "^${want}	" <<<"$listing")
    say "$name: $archive -> docker://$registry/$name:$tag"
    "$SKOPEO" copy --preserve-digests --digestfile "$tmp/$name.digest" \
      "oci-archive:$archive" "docker://$registry/$name:$tag"
    pushed="$(cat "$tmp/$name.digest")"
    [ "$pushed" = "$digest" ] || die "$name: the registry holds $pushed, not the archive's manifest $digest"
    printf '%s\t%s\t%s\t%s\n' "$name" "$registry/$name" "$tag" "$pushed" >>"$tmp/published.tsv"
    say "$name: pushed $registry/$name@$pushed"
  done
  "$PYTHON" - "$tmp/published.tsv" "$out" <<'EOF'
import json, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
keys = ("name", "repository", "tag", "digest")
open(sys.argv[2], "w").write(json.dumps([dict(zip(keys, row)) for row in rows], indent=2) + "\n")
EOF
}

notes() {
  local out="$1" identity="$2"
  "$PYTHON" - "$out" "$identity" <<'EOF'
import json, sys
published = {image["name"]: image for image in json.load(open(sys.argv[1]))}
identity = sys.argv[2]
def values(image, indent):
    pad = " " * indent
    return (f"{pad}repository: {image['repository']}\n{pad}tag: \"{image['tag']}\"\n"
            f"{pad}digest: {image['digest']}\n")
out = ["## Images", "", "| image | digest |", "|---|---|"]
out += [f"| `{i['repository']}:{i['tag']}` | `{i['digest']}` |" for i in published.values()]
out += ["", "## Install these images, pinned by digest", "",
        "Mirror both images into a registry you control, keeping their digests "
        "(`skopeo copy --preserve-digests`), and set `repository` to your mirror; the digests stay the same.", "",
        "```yaml"]
if "pdfleet-operator" in published:
    out.append("image:\n" + values(published["pdfleet-operator"], 2).rstrip("\n"))
if "pdfleet-runtime" in published:
    out.append("runtime:\n  image:\n" + values(published["pdfleet-runtime"], 4).rstrip("\n"))
out += ["```", "", "## Verify the signatures", "",
        "Each image is signed by digest with cosign, keyless, by this release's workflow:", "", "```sh"]
for image in published.values():
    ref = f"{image['repository']}@{image['digest']}"
    out.append(f"cosign verify {ref} \\\n  --certificate-identity '{identity}' \\\n"
               "  --certificate-oidc-issuer https://token.actions.githubusercontent.com")
out.append("```")
print("\n".join(out))
EOF
}

case "${1:-}" in
  check-version) [ $# -eq 2 ] || die "usage: $0 check-version TAG"; check_version "$2" ;;
  push) [ $# -eq 5 ] || die "usage: $0 push INDEX REGISTRY TAG OUT"; push "$2" "$3" "$4" "$5" ;;
  notes) [ $# -eq 3 ] || die "usage: $0 notes OUT CERT_IDENTITY"; notes "$2" "$3" ;;
  *) die "usage: $0 check-version TAG | push INDEX REGISTRY TAG OUT | notes OUT CERT_IDENTITY" ;;
esac
