#!/usr/bin/env bash
# Install the real sglang 0.5.23 into a virtual environment, importable on a CPU-only machine.
#
# Usage: hack/install-sglang.sh [PYTHON]      (PYTHON defaults to .venv/bin/python of this repo)
#
# What it does (see the header of requirements/sglang-cpu.txt for why):
#   1. If every package pinned in requirements/sglang-cpu.txt is installed at its pinned version, the
#      CUDA stubs are in place and `import sglang` reports 0.5.23, it says so and exits 0 (a few seconds).
#   2. Otherwise: pip install --no-deps --only-binary=:all: -r requirements/sglang-cpu.txt.
#   3. Builds stub libraries in torch/lib for every CUDA library that torch's shared objects link against
#      but that is not installed (cublas, cudnn, nccl, ...): each stub function aborts with its own name.
#      Needs a C compiler (cc) and readelf (binutils). Stubs are rebuilt on every install; where the real
#      library is installed (a GPU machine), no stub is made for it.
#   4. Checks that torch, sglang, the router and deepseek-recipe import, and names what failed otherwise.
# Needs: PyPI (about 0.9 GB of wheels on a cold cache), cc, readelf.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
REQ="$ROOT/requirements/sglang-cpu.txt"
WANT_VERSION="0.5.23"

die() {
    echo "install-sglang: ERROR: $*" >&2
    exit 1
}
say() { echo "install-sglang: $*"; }

[ -x "$PY" ] || die "no python at '$PY' (pass the venv's python as \$1, e.g. .venv/bin/python)"
[ -f "$REQ" ] || die "missing $REQ"

# Prints the pinned packages that are absent or at another version, one per line; nothing when all match.
missing_pins() {
    "$PY" - "$REQ" <<'PYEOF'
import importlib.metadata as md
import re
import sys

for raw in open(sys.argv[1], encoding="utf-8"):
    line = raw.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, version = line.partition("==")
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(f"{name}=={version} (not installed)")
        continue
    if have != version:
        print(f"{name}=={version} (installed: {have})")
PYEOF
}

# Fails (non-zero) when the stub marker lists a stub that is gone.
stubs_intact() {
    "$PY" - <<'PYEOF'
import importlib.util
import pathlib
import sys

spec = importlib.util.find_spec("torch")
if spec is None or spec.origin is None:
    sys.exit(1)
lib = pathlib.Path(spec.origin).parent / "lib"
marker = lib / "PDFLEET_CUDA_STUBS.txt"
if not marker.exists():
    sys.exit(1)
sys.exit(0 if all((lib / n).exists() for n in marker.read_text().split()) else 1)
PYEOF
}

# Imports sglang, torch, the router and deepseek-recipe (DeepSeek V4's parser, a native wheel); prints the
# sglang version on success.
import_check() {
    "$PY" - <<'PYEOF' 2>&1
import warnings

warnings.simplefilter("ignore")
import deepseek_recipe  # noqa: F401
import torch  # noqa: F401
import sglang
import sglang_router  # noqa: F401
print(sglang.__version__)
PYEOF
}

build_stubs() {
    command -v cc >/dev/null || die "no C compiler 'cc' on PATH: needed to build the CUDA stub libraries (apt-get install gcc)"
    command -v readelf >/dev/null || die "no 'readelf' on PATH: needed to find torch's CUDA links (apt-get install binutils)"
    "$PY" - <<'PYEOF'
"""Build a stub for every CUDA shared library that torch links against but that is not installed."""
import collections
import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

MARKER = "PDFLEET_CUDA_STUBS.txt"
# References without a symbol version are assigned to their library by name prefix.
UNVERSIONED = (("cusparseLt", "libcusparseLt.so.0"), ("nccl", "libnccl.so.2"), ("cuFile", "libcufile.so.0"))
# The driver: torch loads it lazily (dlopen), never at import, and it must stay absent on a CPU.
SKIP = {"libcuda.so.1"}


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


spec = importlib.util.find_spec("torch")
if spec is None or spec.origin is None:
    sys.exit("torch is not installed")
lib = pathlib.Path(spec.origin).parent / "lib"
site = lib.parent.parent
marker = lib / MARKER
if marker.exists():
    for name in marker.read_text().split():
        (lib / name).unlink(missing_ok=True)
    marker.unlink()
search = [lib, *sorted(site.glob("nvidia/*/lib"))]
ldconfig = shutil.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if pathlib.Path(p).exists()), None)
system = run(ldconfig, "-p") if ldconfig else ""  # libraries the system itself provides

wanted: dict[str, set[str]] = collections.defaultdict(set)
for so in sorted(lib.glob("*.so*")):
    needed = re.findall(r"\(NEEDED\).*\[(.+?)\]", run("readelf", "-d", str(so)))
    missing = {
        n
        for n in needed
        if n not in SKIP
        and re.match(r"lib(cu|nccl|nvrtc|nvshmem|nvjitlink|nvToolsExt)", n)
        and not any((d / n).exists() for d in search)
        and f"{n} " not in system
    }
    if not missing:
        continue
    version_file: dict[str, str] = {}
    current = ""
    for line in run("readelf", "-V", str(so)).splitlines():
        if m := re.search(r"File: (\S+)", line):
            current = m.group(1)
        elif (m := re.search(r"Name: (\S+)", line)) and current:
            version_file[m.group(1)] = current
    for n in missing:
        wanted[n]  # a stub even when no symbol is referenced (only the soname is needed)
    for line in run("readelf", "-W", "--dyn-syms", str(so)).splitlines():
        p = line.split()
        if len(p) < 8 or p[6] != "UND" or p[4] == "WEAK":
            continue
        name, _, ver = p[7].partition("@")
        ver = ver.lstrip("@")
        if ver:
            if version_file.get(ver) in missing:
                wanted[version_file[ver]].add(f"{name}@{ver}")
        else:
            for prefix, target in UNVERSIONED:
                if name.startswith(prefix) and target in missing:
                    wanted[target].add(name)

made = []
with tempfile.TemporaryDirectory() as tmp:
    for soname, syms in sorted(wanted.items()):
        names = sorted({s.split("@")[0] for s in syms})
        versions = sorted({s.split("@")[1] for s in syms if "@" in s})
        src = pathlib.Path(tmp, soname + ".c")
        body = [
            "/* Generated by pdfleet hack/install-sglang.sh: a CPU-only stand-in for " + soname + ". */",
            "#include <stdio.h>",
            "#include <stdlib.h>",
            "static void die(const char *s) {",
            '  fprintf(stderr, "pdfleet CUDA stub: %s from ' + soname + " was called, but this CPU-only test "
            'environment has no CUDA (see hack/install-sglang.sh)\\n", s);',
            "  abort();",
            "}",
        ]
        body += [f'int {n}(void) {{ die("{n}"); return 1; }}' for n in names]
        src.write_text("\n".join(body) + "\n")
        cmd = ["cc", "-shared", "-fPIC", "-O0", f"-Wl,-soname,{soname}", "-o", str(lib / soname), str(src)]
        if len(versions) > 1:
            sys.exit(f"{soname}: more than one symbol version {versions}; extend the stub builder")
        if versions:
            script = pathlib.Path(tmp, soname + ".map")
            script.write_text(f"{versions[0]} {{ global: {' '.join(n + ';' for n in names)} local: *; }};\n")
            cmd.insert(1, f"-Wl,--version-script={script}")
        subprocess.run(cmd, check=True)
        made.append(soname)
marker.write_text("".join(n + "\n" for n in made))
print(f"install-sglang: built {len(made)} CUDA stub libraries in {lib}: {' '.join(made) or '(none needed)'}")
PYEOF
}

# 1. Fast path.
not_matching="$(missing_pins)" || die "could not read the installed packages with $PY"
if [ -z "$not_matching" ] && stubs_intact; then
    if version="$(import_check)" && [ "$(tail -n1 <<<"$version")" = "$WANT_VERSION" ]; then
        say "sglang $WANT_VERSION and all $(grep -cE '^[A-Za-z]' "$REQ") pinned packages already installed in $PY; nothing to do"
        exit 0
    fi
fi

# 2. Install.
if [ -n "$not_matching" ]; then
    say "installing $(wc -l <<<"$not_matching") of the pinned packages into $PY:"
    sed 's/^/    /' <<<"$not_matching"
fi
start=$(date +%s)
if ! "$PY" -m pip install --disable-pip-version-check --no-deps --only-binary=:all: -r "$REQ"; then
    die "pip install --no-deps -r $REQ failed (see pip's message above); packages still missing or at another version:
$(missing_pins)"
fi
still="$(missing_pins)"
[ -z "$still" ] || die "after pip install these pins still do not match:
$still"

# 3. CUDA stubs.
build_stubs || die "building the CUDA stub libraries for torch failed (see the message above)"

# 4. Verify.
if ! version="$(import_check)"; then
    die "sglang does not import after installation:
$version"
fi
version="$(tail -n1 <<<"$version")"
[ "$version" = "$WANT_VERSION" ] || die "import sglang reports version '$version', expected $WANT_VERSION"
say "sglang $version installed in $PY in $(($(date +%s) - start)) s"
