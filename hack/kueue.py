#!/usr/bin/env python3
"""Kueue (sigs.k8s.io/kueue), the batch scheduler that admits a pod group whole or not at all, run against the
local control plane as a process, the way hack/localcluster.py runs the rest.

    kueue.py up       install Kueue's CRDs and webhooks, start it (idempotent), wait until the apiserver reaches it
    kueue.py down     stop the Kueue this tool started, by pid, and remove its webhook configurations
    kueue.py status   say whether it runs

hack/build-binaries.sh builds the binary from Kueue's Go module and copies the module's own CRDs and webhook
manifests beside it; nothing of Kueue lives in this repository. Kueue manages only pods that ask for it: its pod
webhooks select pods with the `kueue.x-k8s.io/queue-name` label, and `manageJobsWithoutQueueName` is off, so
every other pod of the cluster goes nowhere near it, whether it runs or not. It needs PyYAML beside the
standard library (the project's interpreter has it), for Kueue's webhook manifests.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import localcluster as lc  # beside this file; hack/ is not a package

NAME = "kueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SCHEDULING_GATE = "kueue.x-k8s.io/admission"
# Kueue's own namespace (its Configuration's `namespace`); nothing runs in it, Kueue keeps its leases and
# events there.
SYSTEM_NAMESPACE = "kueue-system"
WEBHOOK_CONFIGS = {"MutatingWebhookConfiguration": "pdfleet-kueue-mutating",
                   "ValidatingWebhookConfiguration": "pdfleet-kueue-validating"}
KUEUE_GROUP = "kueue.x-k8s.io"


def version() -> str:
    value = os.environ.get("KUEUE_VERSION")
    if value:
        return value
    return lc.pinned("KUEUE_VERSION")


def binary() -> Path:
    return lc.BIN / "kueue"


def manifests() -> Path:
    """The CRDs and webhook manifests of Kueue's module, copied there by hack/build-binaries.sh."""
    return lc.CACHE / f"kueue-{version()}"


def workdir() -> Path:
    return lc.DIR / "kueue"


def webhook_port() -> int:
    return lc._port("PDFLEET_KUEUE_WEBHOOK_PORT", 20251)


def health_port() -> int:
    return lc._port("PDFLEET_KUEUE_HEALTH_PORT", 20252)


def check_installed() -> None:
    stamp = lc.BIN / ".kueue.version"
    built = stamp.read_text().strip() if stamp.exists() else None
    if not os.access(binary(), os.X_OK) or built != version() or not (manifests() / "webhook").is_dir():
        raise lc.ClusterError(
            f"Kueue {version()} is not built in {lc.BIN} (with its manifests in {manifests()}): build it with "
            f"`hack/build-binaries.sh kueue` (or `make binaries`; needs Go and the Go module proxy).")
    if shutil.which("unshare") is None:
        raise lc.ClusterError("unshare (util-linux) is not installed; Kueue runs in a mount namespace of its own. "
                              "Install it (apt-get install util-linux).")


# ------------------------------------------------------------------------------------------ certificates


def issue_certificates() -> None:
    """A serving certificate for 127.0.0.1 from the cluster's CA, which the webhook configurations trust.

    With its internal cert management off, Kueue reads the webhook's certificate from `webhook.certDir` and its
    metrics server's from a fixed path, /etc/kueue/metrics/certs (cmd/kueue/main.go), even with metrics off.
    The second is given in Kueue's own mount namespace (see `command`), so nothing on the machine changes."""
    lc._issue("kueue-webhook", "/CN=kueue-webhook",
              "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    pki = lc.DIR / "pki"
    for target in (workdir() / "certs", workdir() / "etc" / "kueue" / "metrics" / "certs"):
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pki / "kueue-webhook.crt", target / "tls.crt")
        shutil.copyfile(pki / "kueue-webhook.key", target / "tls.key")
        (target / "tls.key").chmod(0o600)


# ------------------------------------------------------------------------------------------ configuration


def configuration() -> dict[str, object]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": SYSTEM_NAMESPACE,
        # Only what asks for a queue: a pod without the queue-name label is never gated.
        "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "webhook": {"host": lc.HOST, "port": webhook_port(), "certDir": str(workdir() / "certs")},
        "health": {"healthProbeBindAddress": f"{lc.HOST}:{health_port()}"},
        "metrics": {"bindAddress": "0"},  # off: nothing here scrapes it
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["pod"]},
        # The visibility API server would listen on 0.0.0.0:8082 and needs an APIService; nothing here reads it.
        "featureGates": {"VisibilityOnDemand": False},
    }


def _load_yaml(path: Path) -> list[dict]:
    try:
        import yaml
    except ModuleNotFoundError:
        raise lc.ClusterError("PyYAML is missing: run this with the project's interpreter, "
                              ".venv/bin/python hack/kueue.py (`make venv`)") from None
    return [doc for doc in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if doc]


def webhook_configurations() -> list[dict]:
    """Kueue's own webhook manifests, with only the webhooks of Kueue's API and of pods, each pointed at the
    local process by URL. The pod webhooks select pods that carry a queue name: Kueue's manifests select every
    pod (failurePolicy Fail), which would put Kueue in the path of every pod this cluster runs."""
    ca = base64.b64encode((lc.DIR / "pki" / "ca.crt").read_bytes()).decode()
    out = []
    for obj in _load_yaml(manifests() / "webhook" / "manifests.yaml"):
        kept = []
        for hook in obj.get("webhooks", []):
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            resources = {r for rule in hook.get("rules", []) for r in rule.get("resources", [])}
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://{lc.HOST}:{webhook_port()}{path}", "caBundle": ca}
            if groups == {KUEUE_GROUP}:
                kept.append(hook)
            elif groups == {""} and resources == {"pods"}:
                hook["objectSelector"] = {"matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]}
                kept.append(hook)
        obj["webhooks"] = kept
        obj["metadata"] = {"name": WEBHOOK_CONFIGS[obj["kind"]], "labels": {"pdfleet.dev/local-cluster": "true"}}
        out.append(obj)
    return out


def install_api() -> None:
    lc.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifests() / "crds"))
    # kueue.x-k8s.io_workloads.yaml holds workloads.kueue.x-k8s.io
    names = [".".join(reversed(p.stem.split("_", 1))) for p in sorted((manifests() / "crds").glob("*.yaml"))]
    # Polled, not `kubectl wait --for=condition=Established`: on a CRD whose conditions the apiserver has not
    # written yet, kubectl 1.34 fails at once instead of waiting.
    query = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + 60
    for name in names:
        while lc.kubectl("get", "crd", name, "-o", f"jsonpath={query}", check=False).stdout.strip() != "True":
            if time.monotonic() > deadline:
                raise lc.ClusterError(f"CRD {name} not Established within 60 s")
            time.sleep(0.2)
    if lc.kubectl("get", "namespace", SYSTEM_NAMESPACE, check=False).returncode != 0:
        lc.kubectl("create", "namespace", SYSTEM_NAMESPACE)


# ----------------------------------------------------------------------------------------------- process


def command(config: Path) -> list[str]:
    """Kueue in a mount namespace of its own, where /etc is overlaid read-only with its metrics certificate
    (see `issue_certificates`). Without a user namespace when root, since a container may refuse one."""
    ns = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    script = 'mount -t overlay overlay -o "lowerdir=$1:/etc" /etc && shift && exec "$@"'
    return [*ns, "sh", "-c", script, "sh", str(workdir() / "etc"), str(binary()), f"--config={config}",
            f"--kubeconfig={lc.DIR / 'kubeconfig'}", "--zap-log-level=info"]


def healthy() -> bool:
    return lc._http_ok(health_port(), "/readyz")


def webhook_answers() -> bool:
    """The apiserver reached Kueue's pod webhook: a dry-run pod that asks for a queue comes back gated."""
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "pdfleet-kueue-probe", "namespace": "default", "labels": {QUEUE_LABEL: "probe"}},
             "spec": {"containers": [{"name": "c", "image": "registry.invalid/probe:1"}]}}
    proc = lc.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(probe), check=False)
    if proc.returncode != 0:
        return False
    gates = json.loads(proc.stdout)["spec"].get("schedulingGates", [])
    return any(g["name"] == SCHEDULING_GATE for g in gates)


def running() -> int | None:
    return lc._alive_pid(NAME, binary())


def up() -> None:
    if lc.external_kubeconfig():
        raise lc.ClusterError("PDFLEET_KUBECONFIG names an external cluster: install Kueue there yourself "
                              "(its release manifests), this tool runs it only against the local control plane")
    check_installed()
    # A running Kueue slow to answer (a busy machine) is waited for, not restarted: a restart refuses every queue
    # write of whoever uses it meanwhile (a test module's `up` once broke another module's test so).
    if lc.alive_and_answering(NAME, binary(), lambda: healthy() and webhook_answers()):
        lc.say(f"kueue {version()} already running (pid {running()})")
        return
    lc._stop(NAME, binary())
    started = time.monotonic()
    install_api()
    issue_certificates()
    config = workdir() / "config.json"
    config.write_text(json.dumps(configuration(), indent=1))
    for port, env in ((webhook_port(), "PDFLEET_KUEUE_WEBHOOK_PORT"), (health_port(), "PDFLEET_KUEUE_HEALTH_PORT")):
        if lc._port_taken(port):
            raise lc.ClusterError(f"port {lc.HOST}:{port} for Kueue is already in use by another process. Stop "
                                  f"that process or choose another port: export {env}=<free port>")
    log = lc.DIR / "logs" / "kueue.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(command(config), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    # unshare and sh exec into Kueue: the pid is Kueue's.
    lc._pidfile(NAME).write_text(f"{proc.pid}\n")
    # Webhooks go in only once Kueue serves them, so no pod asking for a queue is refused meanwhile.
    deadline = time.monotonic() + float(os.environ.get("PDFLEET_START_TIMEOUT", "120"))
    configs_applied = False
    while True:
        if proc.poll() is not None:
            raise lc.ClusterError(f"kueue exited with code {proc.returncode} while starting. "
                                  f"Last lines of {log}:\n{lc._tail(log)}")
        if time.monotonic() > deadline:
            raise lc.ClusterError(f"kueue did not become ready in time. Last lines of {log}:\n{lc._tail(log)}")
        if not configs_applied and healthy():
            lc.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                             "items": webhook_configurations()}))
            configs_applied = True
        if configs_applied and webhook_answers():
            break
        time.sleep(0.2)
    lc.say(f"kueue {version()} ready in {time.monotonic() - started:.1f} s (pid {proc.pid}, log {log})")


def release_pods() -> None:
    """Pods Kueue still manages carry its finalizer, which only Kueue removes: without it they could never go."""
    out = lc.kubectl("get", "pods", "-A", "-l", "kueue.x-k8s.io/managed=true", "-o", "json", check=False)
    if out.returncode != 0:
        return
    for pod in json.loads(out.stdout)["items"]:
        meta = pod["metadata"]
        kept = [f for f in meta.get("finalizers", []) if f != "kueue.x-k8s.io/managed"]
        lc.kubectl("patch", "pod", meta["name"], "-n", meta["namespace"], "--type=merge",
                   "-p", json.dumps({"metadata": {"finalizers": kept or None}}), check=False)


def down() -> None:
    if lc.external_kubeconfig():
        lc.say("PDFLEET_KUBECONFIG names an external cluster; stopping nothing")
        return
    stopped = lc._stop(NAME, binary())
    apiserver = lc.Ports.from_env().apiserver
    if lc._https_ok(apiserver, "/readyz", client_cert=True):
        for kind, name in WEBHOOK_CONFIGS.items():
            lc.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        release_pods()
    lc.say("kueue stopped" if stopped else "kueue was not running")


def status() -> int:
    pid = running()
    print(f"{NAME:24} {f'running (pid {pid})' if pid else 'stopped'}")
    return 0 if pid else 1


def main(argv: list[str] | None = None) -> int:
    return lc.run_command("kueue", __doc__ or "", {
        "up": lambda _: up(), "down": lambda _: down(), "status": lambda _: status()}, argv)


if __name__ == "__main__":
    sys.exit(main())
