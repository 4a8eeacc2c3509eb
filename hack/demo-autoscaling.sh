# `make demo`'s act four, sourced by hack/demo.sh after act three, with its helpers (step, fail, jp, watch_until)
# and variables (NS, MODEL, PY, STATE, KUBECONFIG) set. The pool it applies is left running, as the others are.
step "Act four: a load ramp, each role autoscaled on its own signal, inside a ratio band"
# examples/local-autoscaling.yaml: a pool of its own, one engine per group, prefill sized on its time to first token
# and decode on its running requests (windows of seconds, so the act takes about two minutes), held to 1 to 2 decode
# groups per prefill group. An open loop ramps 3 -> 20 -> 3 requests a second through its routers, then stops; the
# fleet grows with the ramp and shrinks back once the load is gone. `pdfleet status` shows each role's decision.
RAMP_FILE=${DEMO_RAMP_POOL:-examples/local-autoscaling.yaml}
RAMP_POOL=$(kubectl create -n "$NS" -f "$RAMP_FILE" --dry-run=client -o jsonpath='{.metadata.name}')
kubectl apply -n "$NS" -f "$RAMP_FILE"
watch_until "the autoscaled pool to be Ready" \
  '[ "$(jp pdpool "$RAMP_POOL" -n "$NS" -o jsonpath={.status.phase})" = Ready ]' \
  'kubectl get pdpool "$RAMP_POOL" -n "$NS" --no-headers'
ramp_sizes() {
  jp pdpool "$RAMP_POOL" -n "$NS" -o jsonpath='prefill {.spec.prefill.replicas} ({.status.prefill.ready} ready), decode {.spec.decode.replicas} ({.status.decode.ready} ready)'
}
# What `pdfleet status` says of each role's autoscaling, printed when a size changes (its values change at every
# poll; printing them all would drown the story).
ramp_decisions() {
  .venv/bin/pdfleet status "$RAMP_POOL" -n "$NS" | grep -E '^(Prefill|Decode):|autoscaling:' | cut -c1-200 | sed 's/^/    /'
}
# The load's phase lines not shown yet.
ramp_phases() {
  local total
  total=$(grep -c '^phase ' "$RAMP_LOG" 2>/dev/null || true)
  if [ "${total:-0}" -gt "$RAMP_SHOWN" ]; then
    grep '^phase ' "$RAMP_LOG" | sed -n "$((RAMP_SHOWN + 1)),${total}p"; RAMP_SHOWN=$total
  fi
}
# Follows the pool until `cond` holds (or `timeout` s pass): its sizes when they change, and the load's phase
# lines as they come (what was shown is kept across calls in RAMP_LAST and RAMP_SHOWN).
follow_ramp() {
  local cond=$1 timeout=$2 now p d
  local deadline=$((SECONDS + timeout))
  until eval "$cond"; do
    now=$(ramp_sizes)
    if [ "$now" != "$RAMP_LAST" ]; then
      echo "[$((SECONDS - RAMP_BEGAN))s] $now"; ramp_decisions; RAMP_LAST=$now
      read -r p d <<<"$(jp pdpool "$RAMP_POOL" -n "$NS" -o jsonpath='{.spec.prefill.replicas} {.spec.decode.replicas}')"
      if [ "${p:-1}" -gt 1 ] || [ "${d:-1}" -gt 1 ]; then GREW=1; fi
    fi
    ramp_phases
    [ $SECONDS -lt $deadline ] || { fleet_state; fail "timed out after ${timeout}s waiting for $3"; }
    sleep 2
  done
}
RAMP_IP=$(kubectl get pods -n "$NS" -l "pdfleet.dev/pool=$RAMP_POOL,app.kubernetes.io/component=router" \
  -o jsonpath='{.items[0].status.podIP}')
RAMP_URL="http://$RAMP_IP:$(kubectl get pdpool "$RAMP_POOL" -n "$NS" -o jsonpath='{.spec.router.port}')"
watch_until "its router to have its workers" \
  "$PY -c \"import urllib.request; urllib.request.urlopen('$RAMP_URL/readiness', timeout=2)\" 2>/dev/null" \
  'echo "waiting for the router at $RAMP_URL to discover the engines"' 120
RAMP_LOG="$STATE/load-ramp-$(date +%s).log"
.venv/bin/pdfleet-sim load --pool "$NS/$RAMP_POOL" --kubeconfig "$KUBECONFIG" --model "$MODEL" \
  --ramp 3:20:3 --ramp-seconds 80 --step-seconds 8 --timeout 30 >"$RAMP_LOG" 2>&1 &
LOAD_PID=$!
echo $LOAD_PID >"$STATE/load.pid"
trap 'kill $LOAD_PID 2>/dev/null || true' EXIT
RAMP_BEGAN=$SECONDS GREW=0 RAMP_LAST="" RAMP_SHOWN=0
follow_ramp '! kill -0 $LOAD_PID 2>/dev/null' 150 "the ramp to end"
wait $LOAD_PID 2>/dev/null || true
trap - EXIT
ramp_phases
[ "$GREW" = 1 ] || fail "the fleet did not grow under the ramp"
echo "the ramp is over; with no load left, both roles shrink back (the down window is 20 s):"
follow_ramp '[ "$(ramp_sizes)" = "prefill 1 (1 ready), decode 1 (1 ready)" ]' 120 "the fleet back at one group a role"
echo "[$((SECONDS - RAMP_BEGAN))s] $(ramp_sizes)"
kubectl get events -n "$NS" --field-selector involvedObject.name="$RAMP_POOL" --sort-by=.lastTimestamp \
  -o custom-columns=REASON:.reason,MESSAGE:.message | grep -E '^REASON|^Scaled(Up|Down) ' | cut -c1-180 || true
sed -n '/^phases, each/,$p' "$RAMP_LOG"
failed=$(tail -n1 "$RAMP_LOG" | sed -n 's/.*  failed \([0-9]*\).*/\1/p')
echo "client requests failed over the ramp, the scale-downs included: ${failed:-?} (the goal is zero)"
