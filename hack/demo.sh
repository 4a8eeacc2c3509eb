#!/usr/bin/env bash
# `make demo`: pdfleet's main job on the local fleet, end to end. The chart's own operator Deployment runs (the
# pod runner plays its pod), a PD pool goes Ready on real readiness, requests flow through the real
# sglang-router to simulated engines, then one decode group desyncs: detected, evidence captured, restarted as
# a unit, and the pool is Ready again. Act two rolls out a bad revision (it fails a share of its requests once it
# serves): its canary's bake catches it and the pool rolls back. Act three is the production fix:
# overlapSchedule: Disabled rolled out under load, each group baked, followed with `pdfleet rollout status
# --watch`, every rank on the normal loop, failed requests counted. Act four ramps a load through a pool whose
# roles autoscale inside a ratio band: the fleet grows and shrinks, shown with `pdfleet status`.
# The fleet keeps running afterwards for you to explore.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
NS=${DEMO_NAMESPACE:-pdfleet-demo}
POOL_FILE=${DEMO_POOL:-examples/local-fleet.yaml}
RELEASE_NS=pdfleet-system
RELEASE=pdfleet-demo
eval "$($PY hack/localcluster.py env)"
STATE="$(dirname "$KUBECONFIG")/demo"
mkdir -p "$STATE"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { printf '\033[31mdemo: %s\033[0m\n' "$*" >&2; exit 1; }
# What a wait that timed out leaves to go on: the fleet's pods (not Ready ones say why) and its Warning Events.
fleet_state() {
  echo "pods of namespace $NS:" >&2
  jp pods -n "$NS" -o wide >&2
  jp pods -n "$NS" -o go-template='{{range .items}}{{$p := .metadata.name}}{{range .status.containerStatuses}}{{if not .ready}}{{$p}}: restarts {{.restartCount}}{{with .lastState.terminated}}, last exit {{.exitCode}} {{.reason}}{{end}}{{"\n"}}{{end}}{{end}}{{end}}' >&2
  echo "Warning Events of namespace $NS (last 15):" >&2
  jp events -n "$NS" --field-selector type=Warning --sort-by=.lastTimestamp 2>/dev/null | tail -15 >&2
}
jp() { kubectl get "$@" 2>/dev/null || true; }

# Waits for a shell condition, printing what changes in `show` meanwhile.
watch_until() {
  local what=$1 cond=$2 show=$3 timeout=${4:-180} last="" line
  local deadline=$((SECONDS + timeout))
  until eval "$cond"; do
    line=$(eval "$show" 2>/dev/null || true)
    [ "$line" != "$last" ] && { echo "$line"; last=$line; }
    [ $SECONDS -lt $deadline ] || { fleet_state; fail "timed out after ${timeout}s waiting for $what"; }
    sleep 0.5
  done
}

step "Installing the pdfleet chart: CRD, least-privilege RBAC and the operator Deployment"
# A fresh namespace each time: a fleet left by an earlier demo (and its incident) would answer every wait below.
if kubectl get namespace "$NS" >/dev/null 2>&1; then
  echo "deleting the fleet of an earlier demo in namespace $NS"
  kubectl delete namespace "$NS" --timeout=5m >/dev/null
fi
kubectl create namespace "$NS" >/dev/null
# helm installs a chart's CRDs once and never upgrades them; keep the cluster's CRD current.
kubectl apply --server-side --force-conflicts -f crds/ >/dev/null
# The operator watches only the demo namespace, out of the way of test runs on the same cluster.
# A release of its own (`pdfleet-demo`): the test suite installs and uninstalls its own `pdfleet` release.
helm upgrade --install "$RELEASE" charts/pdfleet --namespace "$RELEASE_NS" --create-namespace \
  --set "watchNamespaces={$NS}" --set logFormat=text --wait --timeout 3m
kubectl get pods -n "$RELEASE_NS" -o wide
echo "the operator runs as a real process (pdfleet-sim plays its pod); its log:"
echo "  $(dirname "$KUBECONFIG")/pods/$RELEASE_NS/<pod>/operator.log"

step "Applying $POOL_FILE in namespace $NS"
POOL=$(kubectl create -n "$NS" -f "$POOL_FILE" --dry-run=client -o jsonpath='{.metadata.name}')
kubectl apply -n "$NS" -f "$POOL_FILE"
watch_until "the pool to be Ready" \
  '[ "$(jp pdpool "$POOL" -n "$NS" -o jsonpath={.status.phase})" = Ready ]' \
  'kubectl get pdpool "$POOL" -n "$NS" --no-headers'
kubectl get pdpool "$POOL" -n "$NS"
kubectl get pods -n "$NS" -l "pdfleet.dev/pool=$POOL" -o wide

step "Requests through the real sglang-router"
ROUTER_IP=$(kubectl get pods -n "$NS" -l "pdfleet.dev/pool=$POOL,app.kubernetes.io/component=router" \
  -o jsonpath='{.items[0].status.podIP}')
ROUTER_PORT=$(kubectl get pdpool "$POOL" -n "$NS" -o jsonpath='{.spec.router.port}')
URL="http://$ROUTER_IP:$ROUTER_PORT"
watch_until "the router to have its workers" \
  "$PY -c \"import urllib.request; urllib.request.urlopen('$URL/readiness', timeout=2)\" 2>/dev/null" \
  'echo "waiting for the router at $URL to discover the engines"' 120
# A stranger with the router's address is served, but may neither read nor change its workers (docs/security.md).
"$PY" - "$URL" "$POOL" <<'EOF' || fail "the router's worker API answered a caller without the pool's key"
import sys, urllib.error, urllib.request
url, pool = sys.argv[1], sys.argv[2]
for method, body in (("GET", None), ("POST", b'{"url": "http://127.0.0.1:9", "worker_type": "decode"}')):
    request = urllib.request.Request(f"{url}/workers", data=body, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=5)
        sys.exit(f"{method} /workers without the pool's key: accepted")
    except urllib.error.HTTPError as e:
        print(f"{method} /workers without the pool's key: HTTP {e.code} (the key is in Secret {pool}-router-key)")
EOF
MODEL=$(kubectl get pdpool "$POOL" -n "$NS" -o jsonpath='{.spec.model.servedName}')
# A load left by an earlier demo goes first (checked by its command line: a stale pid may be reused).
old=$(cat "$STATE/load.pid" 2>/dev/null || true)
if [ -n "$old" ] && grep -qa "pdfleet-sim" "/proc/$old/cmdline" 2>/dev/null; then kill "$old" || true; fi
# A client load in the background into $LOAD_LOG (named after $1), once its requests succeed. Bounded, so that a
# demo killed halfway never leaves a client running for good.
start_load() {
  LOAD_LOG="$STATE/load-$1-$(date +%s).log"
  .venv/bin/pdfleet-sim load --pool "$NS/$POOL" --kubeconfig "$KUBECONFIG" --model "$MODEL" --concurrency 6 \
    --every 2 --duration 900 \
    >"$LOAD_LOG" 2>&1 &
  LOAD_PID=$!
  echo $LOAD_PID >"$STATE/load.pid"
  trap 'kill $LOAD_PID 2>/dev/null || true' EXIT
  watch_until "requests to succeed" '[ "$(grep -c "ok [1-9]" "$LOAD_LOG" 2>/dev/null)" -ge 2 ]' 'tail -n1 "$LOAD_LOG"' 60
  tail -n1 "$LOAD_LOG"
}
start_load desync

step "Injecting a desync into one decode group (one rank stops at a different collective)"
VICTIM=$(kubectl get pods -n "$NS" -l "pdfleet.dev/pool=$POOL,pdfleet.dev/role=decode" \
  -o jsonpath='{.items[0].metadata.name}')
GROUP=$(kubectl get pod "$VICTIM" -n "$NS" -o jsonpath='{.metadata.labels.pdfleet\.dev/group}')
OLD_UID=$(kubectl get pod "$VICTIM" -n "$NS" -o jsonpath='{.metadata.uid}')
kubectl annotate pod "$VICTIM" -n "$NS" sim.pdfleet.dev/fault=desync
echo "its /health still answers 200, as SGLang's does:"
POD_IP=$(kubectl get pod "$VICTIM" -n "$NS" -o jsonpath='{.status.podIP}')
$PY -c "import urllib.request; print('  GET /health ->', urllib.request.urlopen('http://$POD_IP:30000/health', timeout=5).status)"
watch_until "the Desync verdict" \
  '[ -n "$(jp events -n "$NS" --field-selector reason=GroupDesync -o name)" ]' \
  'echo "$(kubectl get pdpool "$POOL" -n "$NS" --no-headers)   load: $(tail -n1 "$LOAD_LOG")"' 60
kubectl get events -n "$NS" --field-selector reason=GroupDesync -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message

echo "the operator takes it out of the router's rotation at once (sglang-router would keep it):"
watch_until "the router to drop it" \
  '[ -n "$(jp events -n "$NS" --field-selector reason=RouterWorkerRemoved -o name)" ]' 'echo waiting' 30
kubectl get events -n "$NS" --field-selector reason=RouterWorkerRemoved -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message

step "Evidence first, then the group restarted as a unit"
watch_until "the evidence ConfigMap" \
  '[ -n "$(jp configmaps -n "$NS" -l "pdfleet.dev/group=$GROUP,pdfleet.dev/evidence=true" -o name)" ]' \
  'echo waiting for evidence' 60
kubectl get configmaps -n "$NS" -l "pdfleet.dev/group=$GROUP,pdfleet.dev/evidence=true"
CM=$(kubectl get configmaps -n "$NS" -l "pdfleet.dev/group=$GROUP,pdfleet.dev/evidence=true" -o jsonpath='{.items[0].metadata.name}')
kubectl get configmap "$CM" -n "$NS" -o jsonpath='{.data.summary\.txt}' | sed 's/^/  /'
watch_until "the group replaced and the pool Ready again" \
  '[ "$(jp pdpool "$POOL" -n "$NS" -o jsonpath={.status.phase})" = Ready ] && [ -n "$(jp pods -n "$NS" -l pdfleet.dev/group=$GROUP -o jsonpath={.items[0].metadata.uid})" ] && [ "$(jp pods -n "$NS" -l pdfleet.dev/group=$GROUP -o jsonpath={.items[0].metadata.uid})" != "$OLD_UID" ]' \
  'echo "$(kubectl get pdpool "$POOL" -n "$NS" --no-headers)   load: $(tail -n1 "$LOAD_LOG")"' 120
# The incident, as the operator reported it (every event of these reasons; the pool's creation is above).
kubectl get events -n "$NS" --field-selector involvedObject.kind=InferencePool --sort-by=.lastTimestamp \
  -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message \
  | grep -E '^TYPE|GroupDesync|RouterWorker|EvidenceCaptured|GroupRestarted|PoolReady'

step "The client's view"
# Requests that were in flight on the desynced group when it hung could not finish: they are the failures.
ok_now() { tail -n1 "$LOAD_LOG" | sed -n 's/.*  ok \([0-9]*\).*/\1/p'; }
restored=$(ok_now)
watch_until "requests to keep succeeding on the restored pool" '[ "$(ok_now)" -ge $((restored + 100)) ]' \
  'tail -n1 "$LOAD_LOG"' 120
kill $LOAD_PID 2>/dev/null || true
wait $LOAD_PID 2>/dev/null || true
trap - EXIT
tail -n1 "$LOAD_LOG"

step "Act two: a bad revision, caught by its canary's bake and rolled back under load"
# A spec change whose engines start, pass their gates, then fail 30% of their requests once they serve (the
# simulator's `failing` fault, in spec.engine.env as any env would be). Its canary is a decode group started
# above replicas (maxSurge): it bakes while every old group serves, its /metrics are compared with theirs, and
# the rollout stops there; the rollback deletes it, and no old group was ever touched.
start_load badrev
kubectl patch pdpool "$POOL" -n "$NS" --type=merge -p \
  '{"spec":{"engine":{"env":[{"name":"PDFLEET_SIM_FAULT","value":"failing"},{"name":"PDFLEET_SIM_FAIL_SHARE","value":"0.3"}]}}}'
if .venv/bin/pdfleet rollout status "$POOL" -n "$NS" --watch --timeout 5m; then
  fail "the bad revision was not stopped"
fi
# The watch ends when the gate fails; the rollback that follows is written, and its Event posted, a moment later.
watch_until "the rollback's Event" \
  '[ -n "$(jp events -n "$NS" --field-selector reason=RolloutRolledBack -o name)" ]' 'echo waiting' 60
kubectl get events -n "$NS" --field-selector involvedObject.kind=InferencePool --sort-by=.lastTimestamp \
  -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message \
  | grep -E '^TYPE|RolloutCanaryBaking|RolloutAnalysisFailed|RolloutRevisionFailed|RolloutRolledBack' || true
back_verified() {
  [ "$(jp pdpool "$POOL" -n "$NS" -o jsonpath='{.status.conditions[?(@.type=="RolloutVerified")].status}')" = True ] &&
    [ "$(jp pdpool "$POOL" -n "$NS" -o jsonpath='{.status.phase}')" = Ready ] &&
    [ "$(jp pdpool "$POOL" -n "$NS" -o jsonpath='{.status.currentRevision}')" = \
      "$(jp pdpool "$POOL" -n "$NS" -o jsonpath='{.status.updateRevision}')" ]
}
watch_until "the pool back on its verified revision" back_verified \
  'echo "$(kubectl get pdpool "$POOL" -n "$NS" --no-headers)   load: $(tail -n1 "$LOAD_LOG")"' 180
kill $LOAD_PID 2>/dev/null || true
wait $LOAD_PID 2>/dev/null || true
trap - EXIT
echo "groups that ever ran the bad revision: one (the decode canary); the client's view: $(tail -n1 "$LOAD_LOG")"

step "Act three: the production fix, overlapSchedule: Disabled, rolled out verified under load"
loops() {
  kubectl get pdpool "$POOL" -n "$NS" \
    -o jsonpath='{range .status.groups[*]}{"  "}{.name}{"  "}{.eventLoop}{"  verified at "}{.verifiedRevision}{"\n"}{end}'
}
echo "every group's scheduler loop, as its ranks report it:"
loops
start_load rollout
kubectl patch pdpool "$POOL" -n "$NS" --type=merge -p '{"spec":{"engine":{"overlapSchedule":"Disabled"}}}'
# A surge group of each role first; then each old group in turn, while replicas groups of its role serve: out
# of the router, drained, replaced, verified (its ranks on the normal loop, its /server_info showing
# --disable-overlap-schedule), back in; the surge groups go last. The CLI follows it as `kubectl rollout status`.
.venv/bin/pdfleet rollout status "$POOL" -n "$NS" --watch --timeout 10m || fail "the rollout did not complete verified"
kill $LOAD_PID 2>/dev/null || true
wait $LOAD_PID 2>/dev/null || true
trap - EXIT
echo "every group's scheduler loop now:"
loops
others=$(kubectl get pdpool "$POOL" -n "$NS" -o jsonpath='{.status.groups[*].eventLoop}' | tr ' ' '\n' \
  | grep -vc '^event_loop_normal_disagg_' || true)
[ "$others" = 0 ] || fail "$others group(s) not on the normal loop"
kubectl get events -n "$NS" --field-selector involvedObject.kind=InferencePool --sort-by=.lastTimestamp \
  -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message | grep -E '^TYPE|GroupCreated|GroupReplaced|GroupDeleted|PoolReady' | tail -n 8 || true
final=$(tail -n1 "$LOAD_LOG")
echo "the client's view of the rollout: $final"
failed=$(echo "$final" | sed -n 's/.*  failed \([0-9]*\).*/\1/p')
echo "client requests failed during the rollout: ${failed:-?} (the goal is zero)"

# Act four is a file of its own (hack/demo-autoscaling.sh), sourced: it uses the helpers above.
source hack/demo-autoscaling.sh

step "Done: the fleet keeps running"
cat <<MSG
  eval "\$(make -s cluster-env)"
  kubectl get pdpool,pods -n $NS -o wide
  .venv/bin/pdfleet-sim load --pool $NS/$POOL --model $MODEL --duration 30   # every router, as a Service would
  kubectl annotate pod <decode pod> -n $NS sim.pdfleet.dev/fault=desync      # again
  .venv/bin/pdfleet-sim load --pool $NS/$RAMP_POOL --model $MODEL --ramp 3:20:3 --ramp-seconds 80   # the ramp again
  .venv/bin/pdfleet status $RAMP_POOL -n $NS
Pods' logs and state: $(dirname "$KUBECONFIG")/pods/. Stop everything with: make cluster-down
MSG
