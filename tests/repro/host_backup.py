"""SGLang's host-pool retraction backup (`--disaggregation-decode-retraction-backup host_pool`), built on a CPU.

What is SGLang's own code (0.5.23): the device KV pool (`MHATokenToKVPool`, on the CPU), the host pool
(`MHATokenToKVPoolHost`, `host_token_capacity` slots, unpinned), `HostPoolGroup`,
`HybridCacheController.allocate_host_transfers` / `_move_write_operation`, and `UnifiedRadixCache.backup_kv_cache`
/ `discard_kv_cache_backup` / `evict_host`'s reclaim hook, reached from `ScheduleBatch.release_req` through
`release_req` and `backup_kv_cache`.

Stand-ins, and why: the controller and the radix cache are made with `object.__new__` and given the attributes
those methods read (their constructors start transfer threads and CUDA streams); the radix cache is disabled (it
holds no cached prefix, so reclaiming host slots finds none and a full pool fails the backup, as SGLang's does
when nothing is evictable); the device-to-host copy (`l2_transfer_engine`: SGLang's direct copy is an sgl_kernel
op built for CUDA) copies nothing; and `release_kv_cache`, the device KV row's release, does nothing (the
reproduction's allocator counts free tokens per iteration instead of holding rows).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

ROW = 128  # tokens per request row of the request-to-token table


def release_kv_cache(req: Any, tree_cache: Any, *, checkpoint: bool) -> None:
    """In place of SGLang's: there is no device KV row to give back (see the module docstring)."""
    req.kv.holds_kv = False


def install_release_stand_in() -> None:
    """`release_req` looks `release_kv_cache` up in its module: point it at the stand-in, in this rank only."""
    from sglang.srt.managers import schedule_batch

    schedule_batch.release_kv_cache = release_kv_cache


def _copy_engine() -> Any:
    """In place of `L2TransferEngine`: a submission that copies nothing and is complete at once."""
    done = SimpleNamespace(synchronize=lambda: None)
    return SimpleNamespace(submit_device_to_host=lambda transfers: SimpleNamespace(finish_event=done))


def build(requests: int, host_slots: int) -> tuple[Any, Any, Any]:
    """(device KV pool, host pool, radix cache) for `requests` request rows; the host pool has `host_slots`
    token slots. The radix cache is what `release_req` backs up to and discards from (its `tree_cache`)."""
    import torch
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    size = requests * ROW
    device = MHATokenToKVPool(size=size, page_size=1, dtype=torch.float32, head_num=1, head_dim=4, layer_num=1,
                              device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    host = MHATokenToKVPoolHost(device._mha_buffer_info(), host_to_device_ratio=1.0, host_size=0, page_size=1,
                                layout="layer_first", pin_memory=False, device="cpu", device_capacity_tokens=size,
                                start_layer=0, end_layer=1, host_token_capacity=host_slots)
    group = HostPoolGroup([PoolEntry(name=PoolName.KV, host_pool=host, device_pool=device,
                                     layer_mapper=lambda layer: layer, is_primary_index_anchor=True)])
    controller = object.__new__(HybridCacheController)
    vars(controller).update(mem_pool_host=group, io_backend="direct", is_kv_sharded=False,
                            l2_transfer_engine=_copy_engine())
    rows = object.__new__(ReqToTokenPool)
    rows.req_to_token = torch.arange(1, size + 1, dtype=torch.int32).reshape(requests, ROW)
    cache = object.__new__(UnifiedRadixCache)
    vars(cache).update(req_to_token_pool=rows, tree_core=SimpleNamespace(page_size=1), is_swa_enabled=False,
                       sidecar_pool_specs=[], cache_controller=controller, host_pool_group=group, disable=True)
    return device, host, cache
