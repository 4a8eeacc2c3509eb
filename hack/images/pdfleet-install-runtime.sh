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
