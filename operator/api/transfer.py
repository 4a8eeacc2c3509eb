"""`spec.transfer`: how KV caches move from prefill to decode engines."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from pdfleet.operator.api.base import ApiModel, Rule


class TransferBackend(enum.StrEnum):
    """--disaggregation-transfer-backend. `fake` moves nothing and exists for tests and simulators."""

    MOONCAKE = "mooncake"
    NIXL = "nixl"
    FAKE = "fake"


_NO_IB_FOR_FAKE = Rule(
    cel="!has(self.ibDevice) || self.backend != 'fake'",
    holds=lambda t: t.backend != TransferBackend.FAKE or t.ib_device is None,
    message="ibDevice has no meaning with backend fake",
    field=".ibDevice",
)


class TransferSpec(ApiModel):
    """The KV-transfer backend."""

    RULES = (_NO_IB_FOR_FAKE,)

    backend: TransferBackend = Field(default=TransferBackend.MOONCAKE, description="mooncake, nixl or fake.")
    ib_device: Annotated[str, Field(max_length=256, pattern=r"^[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")] | None = (
        Field(default=None, description="RDMA devices for transfer, e.g. mlx5_0 or mlx5_0,mlx5_1 "
                                        "(--disaggregation-ib-device).")
    )
