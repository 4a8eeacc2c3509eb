#!/usr/bin/env bash
# `make demo`: the local control plane with fake GPU nodes, the chart installed by helm, the operator running
# with the chart's ServiceAccount token, and an example pool going Ready, shown live.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
NS=${DEMO_NAMESPACE:-pdfleet-demo}
POOL_FILE=${DEMO_POOL:-examples/minimal.yaml}
RELEASE_NS=pdfleet-system
eval "$($PY hack/localcluster.py env)"
STATE="$(dirname "$KUBECONFIG")/demo"
mkdir -p "$STATE"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Installing the pdfleet chart (CRD, ServiceAccount, least-privilege RBAC)"
# The in-cluster operator Deployment would be a kwok pod without a process, so the demo runs the operator
# here, with the very ServiceAccount token the Deployment would use: a missing permission shows up.
# helm installs a chart's CRDs once and never upgrades them; keep the cluster's CRD current.
kubectl apply --server-side --force-conflicts -f crds/ >/dev/null
helm upgrade --install pdfleet charts/pdfleet --namespace "$RELEASE_NS" --create-namespace \
  --set operator.enabled=false --wait
kubectl wait --for=condition=Established crd/inferencepools.pdfleet.dev --timeout=60s

kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
step "Starting the operator as system:serviceaccount:$RELEASE_NS:pdfleet"
TOKEN=$(kubectl create token pdfleet -n "$RELEASE_NS" --duration=8h)
SERVER=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
CA=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
umask 077
cat >"$STATE/operator.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$SERVER", certificate-authority: "$CA"}}]
users: [{name: pdfleet, user: {token: "$TOKEN"}}]
contexts: [{name: local, context: {cluster: local, user: pdfleet}}]
current-context: local
KC
# A demo operator from an earlier run goes first (checked by its command line: a stale pid may be reused).
old=$(cat "$STATE/operator.pid" 2>/dev/null || true)
if [ -n "$old" ] && grep -qa "pdfleet.operator" "/proc/$old/cmdline" 2>/dev/null; then
  kill "$old"
  while kill -0 "$old" 2>/dev/null; do sleep 0.2; done
fi
# Watching only the demo namespace keeps it out of the way of test runs on the same cluster.
$PY -m pdfleet.operator --kubeconfig "$STATE/operator.kubeconfig" --namespace "$NS" --bind-address 127.0.0.1 \
  --metrics-port 19090 --health-port 18080 --log-format text >"$STATE/operator.log" 2>&1 &
echo $! >"$STATE/operator.pid"
for _ in $(seq 1 100); do
  $PY -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:18080/readyz', timeout=1)" 2>/dev/null && break
  kill -0 "$(cat "$STATE/operator.pid")" 2>/dev/null || { cat "$STATE/operator.log"; echo "the operator exited"; exit 1; }
  sleep 0.3
done
echo "operator ready; logs: $STATE/operator.log, metrics: http://127.0.0.1:19090/metrics"

step "Applying $POOL_FILE in namespace $NS"
kubectl apply -n "$NS" -f "$POOL_FILE"
POOL=$(kubectl apply -n "$NS" -f "$POOL_FILE" --dry-run=client -o jsonpath='{.metadata.name}')

step "Watching the pool (kubectl get pdpool -w)"
last=""
for _ in $(seq 1 240); do
  line=$(kubectl get pdpool "$POOL" -n "$NS" --no-headers 2>/dev/null || true)
  [ "$line" != "$last" ] && { echo "$line"; last=$line; }
  phase=$(kubectl get pdpool "$POOL" -n "$NS" -o jsonpath='{.status.phase}' 2>/dev/null || true)
  [ "$phase" = Ready ] && break
  sleep 0.5
done
kubectl get pdpool -n "$NS"
[ "$phase" = Ready ] || { echo "the pool did not become Ready; operator log: $STATE/operator.log"; exit 1; }

step "Engine pods on fake GPU nodes (pod IPs are loopback addresses)"
kubectl get pods -n "$NS" -l "pdfleet.dev/pool=$POOL" -o wide

step "The operator's events"
kubectl get events -n "$NS" --field-selector involvedObject.kind=InferencePool \
  -o custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message

step "Done"
cat <<MSG
The pool is Ready. The operator keeps running (pid $(cat "$STATE/operator.pid")); try:
  eval "\$(make -s cluster-env)"
  kubectl patch pdpool $POOL -n $NS --type=merge -p '{"spec":{"decode":{"replicas":2}}}'
  kubectl get pdpool -n $NS -w
Stop it with: kill $(cat "$STATE/operator.pid"); make cluster-down
MSG
