"""Prometheus metrics of the operator, with conventional names (`pdfleet_*`, base units, `_total`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

RECONCILES = Counter(
    "pdfleet_reconcile_total",
    "Reconciles of InferencePools, by result (success, error, rejected, refused, blocked, deleted).",
    ["result"], registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "pdfleet_reconcile_duration_seconds", "Time one reconcile of one InferencePool took, by result.",
    ["result"], registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
POOLS = Gauge("pdfleet_pools", "InferencePools known to the operator, by phase.", ["phase"], registry=REGISTRY)
ENGINE_GROUPS = Gauge(
    "pdfleet_engine_groups", "Engine groups, by role and health verdict.", ["role", "verdict"], registry=REGISTRY,
)
POOLS_WITHOUT_RECOMMENDED_PATCHES = Gauge(
    "pdfleet_pools_without_recommended_patches",
    "InferencePools whose engines run without some recommended fix for their SGLang release, by why: optedOut "
    "(patchPolicy Explicit) or held (fixes added by an operator upgrade, rolled out with the pool's next change).",
    ["reason"], registry=REGISTRY,
)
KUBE_REQUESTS = Counter(
    "pdfleet_kube_requests_total", "Requests the operator sent to the Kubernetes API, by verb, resource and code.",
    ["verb", "resource", "code"], registry=REGISTRY,
)
GROUP_RESTARTS = Counter(
    "pdfleet_group_restarts_total",
    "Engine groups restarted as a unit, by reason (PodEnded, or the rank-health verdict: Desync, Hang, Dead).",
    ["reason"], registry=REGISTRY,
)
EVIDENCE_CAPTURES = Counter(
    "pdfleet_evidence_captures_total", "Evidence bundles captured from sick groups before a restart, by result.",
    ["result"], registry=REGISTRY,
)
DETECTION = Histogram(
    "pdfleet_rank_health_detection_seconds",
    "How long a group's ranks had been frozen when the operator first judged them in Desync or Hang: the time to "
    "detect, at least health.desyncAfter (or hangAfter) plus up to one heartbeatPeriod.",
    ["verdict"], registry=REGISTRY,
    buckets=(1, 2, 3, 4, 5, 7.5, 10, 15, 20, 30, 45, 60, 120, 300, 600, 1200, 3600),
)
ROUTER_WORKER_CHANGES = Counter(
    "pdfleet_router_worker_changes_total",
    "Workers the operator removed from or added to a pool's routers, by action and reason (a rank-health "
    "verdict, terminating, not Ready, stale, wrong role, in rotation).",
    ["action", "reason"], registry=REGISTRY,
)
ROUTER_AVAILABLE_WORKERS = Gauge(
    "pdfleet_router_available_workers",
    "Workers of a role a pool's router pod can send requests to (healthy in its own checks, circuit not open), as "
    "the operator read them at its last health poll; 0 means the router answers that role's requests 503.",
    ["namespace", "pool", "router", "role"], registry=REGISTRY,
)
ROUTER_CIRCUIT_RESETS = Counter(
    "pdfleet_router_circuit_resets_total",
    "Circuit breakers the operator reset on a pool's routers (a worker it judges healthy re-registered), by why: "
    "the role had no available worker, or a fault elsewhere in the pool opened it.",
    ["reason"], registry=REGISTRY,
)
TOOLCALL_CANARY_RUNS = Counter(
    "pdfleet_toolcall_canary_runs_total",
    "Tool-call canary runs of the toolCallCanary verification gate at new decode groups' leaders, by result "
    "(Passed; Failed: a leak, a malformed call or a tool request answered without calls; Waiting: inconclusive, "
    "retried).",
    ["result"], registry=REGISTRY,
)
ROLE_SCALES = Counter(
    "pdfleet_role_scales_total",
    "Scales of a role through its InferencePoolRole (kubectl scale, an HPA, KEDA) the operator acted on, by role "
    "and result (taken; followed: the other role moved into the ratio band with it; clamped: cut to the band; "
    "refused).",
    ["role", "result"], registry=REGISTRY,
)
AUTOSCALER_DESIRED = Gauge(
    "pdfleet_autoscaler_desired_groups",
    "Engine groups spec.autoscaling's last decision wants for a role of a pool (its replicas once written).",
    ["namespace", "pool", "role"], registry=REGISTRY,
)
AUTOSCALER_SERVING = Gauge(
    "pdfleet_autoscaler_serving_groups",
    "Groups of a role the autoscaler counted as capacity at its last decision (Ready, Healthy, verified at the "
    "role's revision).",
    ["namespace", "pool", "role"], registry=REGISTRY,
)
AUTOSCALER_METRIC = Gauge(
    "pdfleet_autoscaler_metric_value",
    "What the autoscaler last read for a target of a role, per engine (queue and running requests, KV cache usage "
    "0-1) or over the poll's window (time to first token and inter-token latency, in seconds), by metric "
    "(QueuePerEngine, RunningPerEngine, KVCacheUsage, TimeToFirstToken, InterTokenLatency).",
    ["namespace", "pool", "role", "metric"], registry=REGISTRY,
)
AUTOSCALER_DECISIONS = Counter(
    "pdfleet_autoscaler_decisions_total",
    "Scales spec.autoscaling wrote into a pool's spec, by role, direction (up, down) and the rule that set the "
    "number (a target such as KVCacheUsage, StepLimit, MinReplicas, MaxReplicas, RatioFollow, RatioClamp).",
    ["role", "direction", "rule"], registry=REGISTRY,
)
ROLLOUT_ANALYSES = Counter(
    "pdfleet_rollout_analysis_total",
    "Bakes of new engine groups judged (rollout.verification.bake and analysis), by result (passed, failed, "
    "timed_out).",
    ["result"], registry=REGISTRY,
)
ROLLOUT_BAKE_DURATION = Histogram(
    "pdfleet_rollout_bake_duration_seconds",
    "How long a new engine group baked before its bake was judged, by result.",
    ["result"], registry=REGISTRY,
    buckets=(5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600),
)
LEADER = Gauge(
    "pdfleet_leader_is_leader",
    "1 while this operator replica holds the leader-election Lease and reconciles; 0 while it stands by.",
    registry=REGISTRY,
)
LEADER_TRANSITIONS = Counter(
    "pdfleet_leader_transitions_total",
    "Leadership changes of this replica, by transition (acquired, lost, released).",
    ["transition"], registry=REGISTRY,
)
