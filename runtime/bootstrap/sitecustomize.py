"""Loaded by every Python process of an engine pod (the launcher puts this folder on PYTHONPATH), so that
SGLang's spawned scheduler ranks get pdfleet's patches and rank instrumentation too. Does nothing unless the
launcher exported PDFLEET_PATCHES; never lets a failure pass silently (a rank that cannot be patched exits)."""

import os

if os.environ.get("PDFLEET_PATCHES") is not None:
    from pdfleet.runtime import engine_setup

    engine_setup.install_from_environment()
