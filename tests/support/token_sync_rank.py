"""One rank of a token-agreement check: SGLang's own sampler step that reconciles the sampled token ids of a
tensor-parallel group (`Sampler._sync_token_ids_across_tp`), on a real gloo group.

`python -m tests.support.token_sync_rank RANK WORLD PORT` prints, as JSON, the token ids this rank goes on with
after the step. Each rank starts from the same batch but its last token, as a non-deterministic kernel would pick
it. SGLang reads SYNC_TOKEN_IDS_ACROSS_TP when its sampler module is executed; the module is executed again here
(a program forked from the tests' zygote has it imported already, under the zygote's environment), so the
environment this program is started with decides, as an engine's does.
"""

from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace


def main() -> None:
    rank, world, port = (int(a) for a in sys.argv[1:4])
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        sampler = importlib.reload(importlib.import_module("sglang.srt.layers.sampler"))
        tokens = torch.tensor([11, 22, 33 + rank], dtype=torch.int64)
        sampler.Sampler._sync_token_ids_across_tp(SimpleNamespace(tp_sync_group=dist.group.WORLD), tokens,
                                          SimpleNamespace(grammars=None))
        print(json.dumps(tokens.tolist()), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
