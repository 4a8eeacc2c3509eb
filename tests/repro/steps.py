"""What a step-by-step reproduction's ranks share: joining the group, and a result file a test may read while
the rank is still writing it.

A rank of such a reproduction rewrites `rank{N}.json` after every step, so that a test can tell where each rank
is when some of them never finish. The file is replaced whole (written beside it, then renamed), so a reader
sees the last step's record or the one before, never a half-written file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from tests.repro import decode_loop
from tests.repro import scenario as scenario_mod

Run = Callable[[scenario_mod.Scenario, int, Any], None]  # (scenario, rank, gloo group)


def save(sc: scenario_mod.Scenario, rank: int, record: dict[str, Any]) -> None:
    path = sc.result_path(rank)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, path)


def rank_main(run: Run) -> Callable[[scenario_mod.Scenario, int], None]:
    """The rank process's body for `decode_loop.launch`: join the gloo group and the ledger, then `run`."""

    def main(sc: scenario_mod.Scenario, rank: int) -> None:
        import torch.distributed as dist

        decode_loop.join(sc, rank).close()
        run(sc, rank, dist.group.WORLD)

    return main
