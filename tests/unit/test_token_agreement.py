"""Sampled tokens agree across the tensor-parallel ranks of every group of more than one rank: the operator renders
SGLang's own switch for it (SYNC_TOKEN_IDS_ACROSS_TP), and SGLang's real sampler step, on a real gloo group of two
ranks whose last sampled token differs, leaves the ranks with different tokens without it and the same with it."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest

from pdfleet.operator.api.flags import TOKEN_AGREEMENT_ENV
from pdfleet.operator.cache import Observed
from pdfleet.operator.planning import reconcile
from tests.support import forkserver
from tests.support.pools import pool_body
from tests.support.ports import free_port


def engine_env(**roles: Any) -> dict[str, dict[str, str]]:
    """The engine container's environment of each pod the operator renders for a pool, by pod name."""
    pool = pool_body(**roles)
    plan = reconcile.plan(pool, Observed(pool=pool, owned={}), now=datetime.datetime.now(datetime.UTC))
    assert plan.status is not None and "InvalidSpec" not in str(plan.status["conditions"]), plan.status
    return {o["metadata"]["name"]: {e["name"]: e.get("value") for e in o["spec"]["containers"][0]["env"]}
            for o in plan.apply if o["kind"] == "Pod"}


def test_every_group_of_more_than_one_rank_runs_with_token_agreement_and_a_single_rank_without() -> None:
    envs = engine_env(prefill__tp=1, prefill__gpusPerNode=1, decode__tp=2, decode__gpusPerNode=2)
    assert {name: env.get(TOKEN_AGREEMENT_ENV) for name, env in envs.items()} == {
        "tiny-prefill-0-0": None, "tiny-decode-0-0": "1"}


def ranks_after_the_sampler(env: dict[str, str], logs: Path) -> list[list[int]]:
    """Each rank's token ids after SGLang's sampler step, two ranks forked from the tests' zygote."""
    port = free_port()
    env = {**env, "GLOO_SOCKET_IFNAME": "lo", "PYTHONWARNINGS": "ignore"}
    ranks = [forkserver.shared().spawn("tests.support.token_sync_rank", (str(rank), "2", str(port)), env=env,
                                       log=logs / f"rank-{rank}.log") for rank in range(2)]
    for rank, proc in enumerate(ranks):
        assert proc.wait(timeout=120) == 0, (logs / f"rank-{rank}.log").read_text()[-3000:]
    return [json.loads((logs / f"rank-{rank}.log").read_text().strip().splitlines()[-1]) for rank in range(2)]


@pytest.mark.parametrize("rendered", [False, True], ids=["without", "as-rendered"])
def test_sglangs_sampler_leaves_tp_ranks_with_one_token_only_as_the_operator_renders_it(rendered: bool,
                                                                                       tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_AGREEMENT_ENV}
    if rendered:
        rendered_env = engine_env(decode__tp=2, decode__gpusPerNode=2)["tiny-decode-0-0"]
        env |= {TOKEN_AGREEMENT_ENV: rendered_env[TOKEN_AGREEMENT_ENV]}
    ranks = ranks_after_the_sampler(env, tmp_path)
    if rendered:
        assert ranks == [[11, 22, 33], [11, 22, 33]], "one token per request on every rank: the MIN of theirs"
    else:
        assert ranks == [[11, 22, 33], [11, 22, 34]], "each rank goes on with the token it sampled"
