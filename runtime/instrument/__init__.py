"""Rank-health instrumentation of SGLang's scheduler: where each rank writes its ledger record.

Always installed by the engine launcher (not a catalogue choice: the operator's verdicts depend on it), and
verified like every patch: each seam is a named SGLang function with a pinned fingerprint, checked before
anything is replaced.

The seams are chosen so that every one of the scheduler's event loops passes through them, instead of
patching each `event_loop_*` variant (see docs/architecture.md, "Where pdfleet hooks into SGLang"):
- `loop`: the loop dispatcher (`_dispatch_event_loop_once`): attach the rank to the pod's ledger and record
  which loop SGLang picked. This part is the catalogue's `overlap-loop-report` patch.
- `seams`: the tiny hot-path wrappers: the per-iteration input intake (one `step()` per iteration), the
  request broadcast, the KV-poll all-reduces, the DP-attention all-gather, forward and idle.
- `rank_seams`: which SGLang functions get which wrapper, with their fingerprints.
- `apply`: verify and install the seams, composing over catalogue patches of the same functions.
- `placement`: which ledger slot a rank writes (pure arithmetic on SGLang's rank layout).
- `agent`: the pod's rank-health agent as the launcher runs it (adds `/livez`).

Standard library only at import time: the modules import SGLang only when a seam is installed or run.
"""
