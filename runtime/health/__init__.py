"""Per-rank health of an SGLang engine: the shared-memory ledger each scheduler rank writes on every loop
step, the agent that serves it over HTTP, and the pure verdict the operator derives from it.

Modules, from the hot path outwards:
- `phases`: the fixed tables (phase, event loop) a record refers to by small integer ids.
- `layout`: where each field lives in the shared file; the one place that knows byte offsets.
- `writer`: `RankWriter`, the only code that runs inside the scheduler loop.
- `ledger`: opening the file, attaching writers, reading consistent snapshots.
- `records`: `RankRecord`, the decoded, immutable view of one slot.
- `procs`: is the process that wrote a slot still the one alive under that pid.
- `stacks`: on-demand Python stacks of a rank, even one blocked in C.
- `report`: the JSON the agent serves, and its parser for the operator.
- `verdict`: `judge`, from the reports of a group's ranks to Healthy / Desync / Hang / ...
- `agent`: the HTTP server of one engine pod.

Everything here is standard library only: it runs inside SGLang's own image.
"""
