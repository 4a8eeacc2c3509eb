"""The SGLang 0.5.23 functions docs/desync-audit.md audits, pinned by fingerprint.

Pure data. Each fingerprint is `pdfleet.runtime.patches.targets.fingerprint` of the function as installed,
the same hash the patch framework verifies targets with. tests/unit/test_desync_audit.py fails, naming the
function, when the installed copy differs or is gone: the audit then no longer describes the code.
"""

from __future__ import annotations

SGLANG_VERSION = "0.5.23"

# dotted name -> fingerprint, grouped as the audit groups them.
AUDITED: dict[str, str] = {
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.event_loop_normal_disagg_decode":
        "d9a84e815606d587",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode":
        "d090e60c308d4943",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.event_loop_normal_disagg_prefill":
        "1f8708ba259a53da",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.event_loop_overlap_disagg_prefill":
        "e627e88b1872f46b",
    "sglang.srt.managers.scheduler.Scheduler.ingest_requests":
        "4ba77891bd6e4a76",
    "sglang.srt.managers.scheduler.Scheduler._poll_timeout_aborts":
        "2852859c0464edb9",
    "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver.recv_requests":
        "99df392a0e02a486",
    "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver._broadcast_reqs_across_ranks":
        "3d7b97e5e3a9482a",
    "sglang.srt.managers.scheduler_components.recv_skipper.SchedulerRecvSkipper.handle":
        "0f167fbf4e20c283",
    "sglang.srt.managers.scheduler_input_blocker.SchedulerInputBlocker.handle":
        "b179856dda8e27b1",
    "sglang.srt.utils.poll_based_barrier.PollBasedBarrier._compute_global_arrived":
        "49ee07c61298a140",
    "sglang.srt.utils.broadcast_pyobj":
        "a5aa8858f2f8ef64",
    "sglang.srt.distributed.communication_op.attn_cp_tp_broadcast_pyobj":
        "a2fef272ed8cc947",
    "sglang.srt.managers.scheduler.Scheduler.process_input_requests":
        "4abf9f52a087f303",
    "sglang.srt.managers.scheduler.Scheduler._gather_vmm_materialization_errors":
        "4a7b38dc4c315023",
    "sglang.srt.managers.scheduler.Scheduler.is_fully_idle":
        "8cfe1adc12240c08",
    "sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper.handle":
        "2acd44a27dcb38cc",
    "sglang.srt.managers.scheduler_components.flush_wrapper.SchedulerFlushWrapper.check_pending":
        "6beac392af7ce66b",
    "sglang.srt.managers.scheduler.Scheduler.flush_cache":
        "145fbc1e3e65e012",
    "sglang.srt.session.session_controller.SessionController.maybe_reap":
        "9069a43fa5edd66d",
    "sglang.srt.managers.scheduler.Scheduler.close_session":
        "bbbfbc1c84bdb786",
    "sglang.srt.managers.scheduler.Scheduler.handle_rpc_request":
        "87835738d2bdb0b9",
    "sglang.srt.managers.scheduler.Scheduler.abort_request":
        "e19c6b7a87fec58e",
    "sglang.srt.managers.scheduler.Scheduler.process_pending_chunked_abort":
        "c625b2339c100456",
    "sglang.srt.disaggregation.decode.DecodePreallocQueue._allocatable_token_budgets": "f22540486a78f6c4",
    "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.ensure_metadata_buffer": "af49e2a51061f56e",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem": "14cbb57bc0ad75bb",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.retract_decode": "578d1d97495f802e",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.release_req": "5a21d297725bfd06",
    "sglang.srt.managers.schedule_batch.release_req": "8b5877a5ccb39124",
    "sglang.srt.mem_cache.common.backup_kv_cache": "850800f592e56d1c",
    "sglang.srt.managers.scheduler.Scheduler.update_running_batch":
        "289c1bd9057ca786",
    "sglang.srt.managers.scheduler.Scheduler.on_idle":
        "851656223a6826f6",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.process_decode_queue":
        "18ed61a5b9ab4162",
    "sglang.srt.disaggregation.decode.DecodePreallocQueue.resume_retracted_reqs":
        "d85f66df1e512238",
    "sglang.srt.disaggregation.decode.DecodeTransferQueue.resolve_deferred_releases":
        "12ec9838e1a398e9",
    "sglang.srt.disaggregation.decode.DecodePreallocQueue.pop_preallocated":
        "b9905e593525ae62",
    "sglang.srt.disaggregation.decode.DecodePreallocQueue._update_handshake_waiters":
        "48508b8bf97ac7db",
    "sglang.srt.disaggregation.decode.DecodeTransferQueue.pop_transferred":
        "48b558ef62c0e97d",
    "sglang.srt.disaggregation.decode.DecodeTransferQueue._poll_with_metadata_gate":
        "4976472dc53c84ea",
    "sglang.srt.disaggregation.decode.DecodeTransferQueue._poll_with_staging":
        "0fa5f5cc90a6d091",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run":
        "58a3f73a70762a47",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch":
        "d3ebcae52eb00721",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch":
        "8441dc90d3bf1621",
    "sglang.srt.constrained.grammar_manager.GrammarManager.get_ready_grammar_requests":
        "56f6d3a98b15e35a",
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin._verify_kv_checksums":
        "3d75c411640a2e51",
    "sglang.srt.disaggregation.decode_kvcache_offload_manager.DecodeKVCacheOffloadManager.check_offload_progress":
        "9ccbabd4e7ceea23",
    "sglang.srt.disaggregation.decode_kvcache_offload_manager.DecodeKVCacheOffloadManager.drain_before_retraction":
        "f165f14fa5eea894",
    "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.pop_bootstrapped":
        "0ecb934dee8b9774",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run":
        "ea73fd6db9788a26",
    "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill":
        "6c648f1cb7e482bf",
    "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw":
        "cc447dbdf748b6ac",
    "sglang.srt.mem_cache.prefill_budget.PrefillBudget._available_and_evictable":
        "0f8a1220faecb84c",
    "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req":
        "2759f73ad5f207b3",
    "sglang.srt.managers.prefill_delayer.PrefillDelayer._gather_info":
        "dfe78562921b99f2",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.resolve_waiting_queue_bootstrap":
        "d46052adb7948a70",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_prefill_chunk":
        "fb613f761a11235d",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.check_bootstrap":
        "48a4da7693103bc0",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue":
        "b67e2acef55ff84f",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.is_disagg_prefill_batch_result_ready":
        "a643bc8612643394",
    "sglang.srt.managers.scheduler_components.dp_attn.SchedulerDPAttnAdapter.maybe_prepare_mlp_sync_batch":
        "024cab11ff7e1552",
    "sglang.srt.managers.scheduler_components.dp_attn.prepare_mlp_sync_batch_raw":
        "f37d48405fdb24e2",
    "sglang.srt.disaggregation.utils.all_reduce_flags":
        "9184eae4a9a6eb5a",
    "sglang.srt.disaggregation.utils.poll_and_all_reduce":
        "c8c7f64e3a736618",
    "sglang.srt.disaggregation.utils.poll_and_all_reduce_attn_cp_tp_group":
        "6003aaa2ccaa631a",
    "sglang.srt.disaggregation.utils.poll_and_all_reduce_with_staging":
        "74bd768e4c060c4e",
    "sglang.srt.managers.scheduler_components.dp_attn.MLPSyncBatchInfo.all_gather":
        "1b05fef0b29417fe",
    "sglang.srt.managers.scheduler_components.dp_attn.exchange_sync_rows":
        "c8fd0ccbf766a759",
    "sglang.srt.managers.scheduler_components.request_receiver.SchedulerRequestReceiver._finalize_shm_features":
        "dcc370f77593c627",
    "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.update_weights_from_tensor":
        "c27c2951392de4ab",
    "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.update_weights_from_ipc":
        "d6e656f2caeeb6c3",
    "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.begin_weight_update":
        "48879d3023946c1a",
    "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.end_weight_update":
        "2df556bb57eaf1cc",
    "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.release_memory_occupation":
        "2a37179bbf6488dc",
    "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.resume_memory_occupation":
        "633b086bf4a770bd",
    "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.check_weights":
        "97998570d5862446",
    "sglang.srt.managers.scheduler_components.profiler_manager.SchedulerProfilerManager._start_profile":
        "ee2d6191b4d6665c",
    "sglang.srt.managers.scheduler_components.profiler_manager.SchedulerProfilerManager._stop_profile":
        "f219e33d2c645ab9",
    # Issue 39 item 6: what the scan reaches through model_runner, and the grammar failure sites.
    "sglang.srt.layers.sampler.Sampler._sync_token_ids_across_tp":
        "91db6683669b7150",
    "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.init_weights_update_group":
        "47e31653420b54a8",
    "sglang.srt.model_executor.model_runner_components.weight_exporter.WeightExporter.init_weights_send_group_for_remote_instance":
        "deba358eb4b2aff2",
    "sglang.srt.model_executor.model_runner_components.weight_exporter.WeightExporter.send_weights_to_remote_instance":
        "19db0ef85a211fd5",
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor._apply_prefill_grammar":
        "cd6750661dbe5faa",
    "sglang.srt.disaggregation.decode_schedule_batch_mixin.ScheduleBatchDisaggregationDecodeMixin.process_prebuilt":
        "446d3137f2137bb0",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_batch_result_disagg_prefill":
        "f8ce20674721341d",
}
