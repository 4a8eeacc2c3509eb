"""Two real rank processes, a real gloo group, the real SGLang request broadcast as the scheduler looks it
up: after the instrumentation is installed, each rank's ledger slot counts the broadcasts it entered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pdfleet.runtime.health import ledger
from pdfleet.runtime.health.phases import Phase
from tests.support import requires
from tests.support.ports import free_port

_RANK = """
import json, sys
import torch.distributed as dist
from pdfleet.runtime import engine_setup
from pdfleet.runtime.health import attach
from pdfleet.runtime.instrument import seams

path, rank, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
engine_setup.apply_selected([])
from sglang.srt.managers.scheduler_components import request_receiver

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
seams.use(attach.attach_rank(slot=rank, rank=rank, slots=2, path=path, stack_signal=None))
received = [
    request_receiver.broadcast_pyobj([f"req-{i}"] if rank == 0 else None, rank, dist.group.WORLD, src=0)
    for i in range(3)
]
dist.destroy_process_group()
print(json.dumps(received))
"""


def test_two_ranks_count_each_real_gloo_broadcast_through_the_patched_receiver(tmp_path: Path) -> None:
    requires.installed("sglang")
    path, port = tmp_path / "ledger", free_port()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(path), str(rank), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert [json.loads(out) for out, _ in outputs] == [[["req-0"], ["req-1"], ["req-2"]]] * 2
    with ledger.Ledger.open_readonly(path) as led:
        recs = led.read_all()
    assert [(r.slot, r.rank, r.phase, r.collectives) for r in recs] == [
        (0, 0, Phase.LOCAL, 3), (1, 1, Phase.LOCAL, 3)]
