#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback: fake nodes without a container runtime, and one real node.

etcd, kube-apiserver (TLS, client-certificate admin, RBAC enforced, service-account tokens),
kube-controller-manager, kube-scheduler, the kwok controller and pdfleet's pod runner (`pdfleet-sim`, which
plays kubelet for pdfleet's own pods, see docs/local-fleet.md) run as local processes, each with a log file
and a pid file under the cluster directory; `up` then starts Kueue, the gang scheduler (hack/kueue.py), against
them. kwok turns fake GPU nodes Ready and pods Running without
containers; every node's podCIDR lies inside 127.0.0.0/8, so a pod's IP is a loopback address a local process
can listen on and nothing is ever sent to a private range. Last, `up` starts the real node (hack/realnode.py: a
kubelet with containerd, in a network namespace of its own; PDFLEET_REAL_NODE=0 leaves it out).

    localcluster.py up       start what is not running (idempotent), create the nodes, wait until Ready
    localcluster.py down     stop the processes this tool started, by pid, and wipe etcd's data
    localcluster.py env      print the shell exports for KUBECONFIG and PATH
    localcluster.py status   say what runs
    localcluster.py nodes    create the fake GPU nodes only (for a cluster of your own with kwok in it)

Standard library only, so `down`, `env` and `status` run before the project's virtual environment exists
(`up` needs PyYAML for Kueue's manifests: the project's interpreter has it). When PDFLEET_KUBECONFIG
names an existing cluster (kind with kwok installed, say), `up` and `down` start and stop nothing and `env`
points at that cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

HACK = Path(__file__).resolve().parent
_XDG = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
CACHE = Path(os.environ.get("PDFLEET_CACHE") or _XDG / "pdfleet")
BIN = Path(os.environ.get("PDFLEET_BIN") or CACHE / "bin")
DIR = Path(os.environ.get("PDFLEET_CLUSTER_DIR") or CACHE / "cluster")
HOST = "127.0.0.1"
SERVICE_CIDR = "10.0.0.0/24"  # an allocation range for Service IPs only; nothing is ever sent there


class ClusterError(Exception):
    """A failure a person can act on; printed as one message, never as a traceback."""


def _port(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        port = int(raw)
    except ValueError:
        raise ClusterError(f"{name}={raw!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise ClusterError(f"{name}={port} is out of range 1-65535")
    return port


@dataclasses.dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    sim: int

    @classmethod
    def from_env(cls) -> Ports:
        return cls(
            etcd=_port("PDFLEET_ETCD_PORT", 23790),
            etcd_peer=_port("PDFLEET_ETCD_PEER_PORT", 23800),
            apiserver=_port("PDFLEET_APISERVER_PORT", 16443),
            controller_manager=_port("PDFLEET_CONTROLLER_MANAGER_PORT", 20257),
            scheduler=_port("PDFLEET_SCHEDULER_PORT", 20259),
            kwok=_port("PDFLEET_KWOK_PORT", 20247),
            sim=_port("PDFLEET_SIM_PORT", 20248),
        )


@dataclasses.dataclass(frozen=True)
class Component:
    name: str
    binary: str
    port: int | None  # the host loopback port it listens on, checked free before it starts; None: none
    port_env: str
    args: list[str]
    ready: Callable[[], bool]
    exe: Path | None = None  # the program when it is not one of the built binaries in BIN
    # Run before the program, which it must exec (the pid stays the program's): `nsenter --net=...` for the
    # real node's processes.
    launcher: tuple[str, ...] = ()

    @property
    def program(self) -> Path:
        return self.exe or BIN / self.binary


def external_kubeconfig() -> Path | None:
    value = os.environ.get("PDFLEET_KUBECONFIG")
    return Path(value).expanduser().resolve() if value else None


def kubeconfig_path() -> Path:
    return external_kubeconfig() or DIR / "kubeconfig"


# ---------------------------------------------------------------------------------------------- processes


def _pidfile(name: str) -> Path:
    return DIR / "run" / f"{name}.pid"


def _alive_pid(name: str, program: Path) -> int | None:
    """The pid of our running `name`, or None. A pid is ours only if its command line is our program (or, for a
    script, the interpreter's first argument is), so a recycled pid never gets signalled."""
    try:
        pid = int(_pidfile(name).read_text().strip())
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]]
    except (OSError, ValueError):
        return None
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X") or str(program) not in cmdline:
        return None
    return pid


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _start(c: Component) -> None:
    if c.port is not None and _port_taken(c.port):
        raise ClusterError(
            f"port {HOST}:{c.port} for {c.name} is already in use by another process. Stop that process or "
            f"choose another port: export {c.port_env}=<free port>"
        )
    log = DIR / "logs" / f"{c.name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*c.launcher, str(c.program), *c.args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives this script, and never gets the terminal's Ctrl-C
        )
    _pidfile(c.name).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + float(os.environ.get("PDFLEET_START_TIMEOUT", "120"))
    while not c.ready():
        if proc.poll() is not None:
            raise ClusterError(f"{c.name} exited with code {proc.returncode} while starting. "
                               f"Last lines of {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{c.name} did not become ready in time. Last lines of {log}:\n{_tail(log)}")
        time.sleep(0.2)
    say(f"{c.name} ready (pid {proc.pid}, log {log})")


def _stop(name: str, program: Path) -> bool:
    pid = _alive_pid(name, program)
    _pidfile(name).unlink(missing_ok=True)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30  # the pod runner first stops its pods, each within its bounded grace
    while time.monotonic() < deadline and _pid_running(pid):
        time.sleep(0.1)
    if _pid_running(pid):
        os.kill(pid, signal.SIGKILL)
        while _pid_running(pid):
            time.sleep(0.05)
    say(f"{name} stopped (pid {pid})")
    return True


def _pid_running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


# ------------------------------------------------------------------------------------------ certificates


def _openssl(*args: str, stdin: str | None = None) -> None:
    try:
        subprocess.run(["openssl", *args], input=stdin, text=True, check=True, capture_output=True)
    except subprocess.CalledProcessError as e:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {e.stderr.strip()}") from None


def _issue(name: str, subject: str, ext: str) -> None:
    pki = DIR / "pki"
    key, csr, crt, cnf = (pki / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    cnf.write_text(ext)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", subject)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
        "-CAcreateserial", "-days", "3650", "-sha256", "-out", str(crt), "-extfile", str(cnf),
    )
    key.chmod(0o600)


CLIENT_EXT = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
              "extendedKeyUsage=clientAuth\n")


# How the apiserver authenticates to the real node's kubelet (logs, exec, port-forward).
KUBELET_CLIENT = "/O=system:masters/CN=kube-apiserver-kubelet-client"


def issue_client(name: str, subject: str) -> None:
    """A client certificate signed by the cluster's CA, once (hack/realnode.py's kubelet identity)."""
    if not (DIR / "pki" / f"{name}.crt").exists():
        _issue(name, subject, CLIENT_EXT)


def ensure_pki() -> None:
    pki = DIR / "pki"
    if (pki / "complete").exists():
        issue_client("kubelet-client", KUBELET_CLIENT)  # a cluster directory made before the real node was
        return
    if shutil.which("openssl") is None:
        raise ClusterError("openssl is not installed; it makes the cluster's certificates. "
                           "Install it (apt-get install openssl).")
    shutil.rmtree(pki, ignore_errors=True)
    pki.mkdir(parents=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=pdfleet-local-ca",
        "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )
    sans = "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc," \
           "DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1"
    _issue("apiserver", "/CN=kube-apiserver",
           f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
           f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n")
    _issue("admin", "/O=system:masters/CN=pdfleet-admin", CLIENT_EXT)
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    issue_client("kubelet-client", KUBELET_CLIENT)
    (pki / "complete").write_text("")


def write_file(path: Path, text: str, mode: int = 0o644) -> bool:
    """Writes `text` to `path` only when it differs, and atomically (a temporary file renamed over it): whatever
    reads the file meanwhile (a test's kubectl while another test's `up` runs) sees the old or the new content,
    never a truncated file. Whether it wrote."""
    with contextlib.suppress(FileNotFoundError):
        if path.read_text() == text and (path.stat().st_mode & 0o777) == mode:
            return False
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
    return True


def write_kubeconfig(ports: Ports) -> None:
    pki = DIR / "pki"
    write_file(DIR / "kubeconfig", f"""apiVersion: v1
kind: Config
clusters:
- name: pdfleet-local
  cluster:
    server: https://{HOST}:{ports.apiserver}
    certificate-authority: {pki / "ca.crt"}
users:
- name: pdfleet-admin
  user:
    client-certificate: {pki / "admin.crt"}
    client-key: {pki / "admin.key"}
contexts:
- name: pdfleet-local
  context: {{cluster: pdfleet-local, user: pdfleet-admin}}
current-context: pdfleet-local
""", mode=0o600)


# ----------------------------------------------------------------------------------------- health checks


def _https_ok(port: int, path: str, client_cert: bool) -> bool:
    ctx = ssl.create_default_context(cafile=str(DIR / "pki" / "ca.crt"))
    if client_cert:
        ctx.load_cert_chain(str(DIR / "pki" / "admin.crt"), str(DIR / "pki" / "admin.key"))
    else:  # controller-manager and scheduler serve self-signed certificates of their own
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://{HOST}:{port}{path}", context=ctx, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def sim_python() -> Path:
    """The interpreter of the pod runner: the project's virtual environment, where SGLang is installed."""
    value = os.environ.get("PDFLEET_SIM_PYTHON")
    return Path(value) if value else HACK.parent / ".venv" / "bin" / "python"


def components(ports: Ports) -> list[Component]:
    pki = DIR / "pki"
    kubeconfig = str(DIR / "kubeconfig")
    etcd_url = f"http://{HOST}:{ports.etcd}"
    peer_url = f"http://{HOST}:{ports.etcd_peer}"
    auth = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={HOST}", "--leader-elect=false"]
    return [
        Component("etcd", "etcd", ports.etcd, "PDFLEET_ETCD_PORT", [
            "--name=pdfleet", f"--data-dir={DIR / 'etcd'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=pdfleet={peer_url}", "--unsafe-no-fsync", "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ], lambda: _http_ok(ports.etcd, "/health")),
        Component("kube-apiserver", "kube-apiserver", ports.apiserver, "PDFLEET_APISERVER_PORT", [
            f"--etcd-servers={etcd_url}", f"--bind-address={HOST}", f"--advertise-address={HOST}",
            f"--secure-port={ports.apiserver}", f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}", f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=Node,RBAC", "--endpoint-reconciler-type=none",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
            f"--audit-policy-file={HACK / 'audit-policy.yaml'}", f"--audit-log-path={DIR / 'logs' / 'audit.log'}",
            "--audit-log-maxsize=200", "--audit-log-maxbackup=2",
            # The real node (hack/realnode.py) is reached at the loopback address the cluster gives it, never
            # through a name the host's resolver would look up.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
        ], lambda: _https_ok(ports.apiserver, "/readyz", client_cert=True)),
        Component("kube-controller-manager", "kube-controller-manager", ports.controller_manager,
                  "PDFLEET_CONTROLLER_MANAGER_PORT", [
            *auth, f"--secure-port={ports.controller_manager}",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            # No Endpoints or EndpointSlices: they refuse loopback pod IPs, and would fill every namespace's
            # events with FailedToUpdateEndpoint warnings. Nothing here may use a Service's address anyway.
            "--use-service-account-credentials=false",
            "--controllers=*,-nodeipam,-endpoint,-endpointslice,-endpointslicemirroring",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false", "--v=1",
        ], lambda: _https_ok(ports.controller_manager, "/healthz", client_cert=False)),
        Component("kube-scheduler", "kube-scheduler", ports.scheduler, "PDFLEET_SCHEDULER_PORT", [
            *auth, f"--secure-port={ports.scheduler}", "--profiling=false", "--v=1",
        ], lambda: _https_ok(ports.scheduler, "/healthz", client_cert=False)),
        Component("kwok", "kwok", ports.kwok, "PDFLEET_KWOK_PORT", [
            f"--kubeconfig={kubeconfig}", f"--config={HACK / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--node-ip={HOST}", "--cidr=127.254.0.0/16", f"--server-address={HOST}:{ports.kwok}",
        ], lambda: _http_ok(ports.kwok, "/healthz")),
        # Ready once its zygote has imported SGLang and it has listed the pods: it can run pods at once.
        Component("pdfleet-sim", "pdfleet-sim", ports.sim, "PDFLEET_SIM_PORT", [
            "-m", "pdfleet.podrunner", f"--cluster-dir={DIR}", f"--kubeconfig={kubeconfig}",
            f"--port={ports.sim}",
        ], lambda: _http_ok(ports.sim, "/healthz"), exe=sim_python()),
    ]


# ----------------------------------------------------------------------------------------------- nodes


def node_manifests() -> list[dict[str, object]]:
    gpu_nodes = int(os.environ.get("PDFLEET_GPU_NODES", "4"))
    gpus = int(os.environ.get("PDFLEET_GPUS_PER_NODE", "8"))
    product = os.environ.get("PDFLEET_GPU_PRODUCT", "NVIDIA-H200")
    cpu_nodes = int(os.environ.get("PDFLEET_CPU_NODES", "1"))
    nodes: list[dict[str, object]] = []
    for i in range(gpu_nodes + cpu_nodes):
        gpu = i < gpu_nodes
        name = f"pdfleet-gpu-{i}" if gpu else f"pdfleet-cpu-{i - gpu_nodes}"
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "type": "kwok", "pdfleet.dev/local-cluster": "true"}
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
        spec: dict[str, object] = {"podCIDR": f"127.1.{i}.0/24", "podCIDRs": [f"127.1.{i}.0/24"]}
        if gpu:
            labels |= {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
                       "nvidia.com/gpu.count": str(gpus),
                       "node.kubernetes.io/instance-type": f"fake-{gpus}x{product.lower()}"}
            capacity["nvidia.com/gpu"] = str(gpus)
            spec["taints"] = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": spec,
            "status": {"capacity": capacity, "allocatable": capacity},
        })
    return nodes


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"KUBECONFIG": str(kubeconfig_path())}
    binary = BIN / "kubectl" if (BIN / "kubectl").exists() else shutil.which("kubectl")
    if binary is None:
        raise ClusterError("kubectl not found: run `make binaries` (hack/build-binaries.sh)")
    proc = subprocess.run([str(binary), *args], input=stdin, text=True, capture_output=True, env=env)
    if check and proc.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _wait(what: str, cond: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; logs are in {DIR / 'logs'}")
        time.sleep(0.25)


def ensure_nodes() -> None:
    nodes = node_manifests()
    # Create, never overwrite: kwok owns the status of a node that exists.
    existing = set(kubectl("get", "nodes", "-o", "name").stdout.split())
    missing = [n for n in nodes if f"node/{n['metadata']['name']}" not in existing]  # type: ignore[index]
    if missing:
        kubectl("create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": missing}))

    wanted = {n["metadata"]["name"] for n in nodes}  # type: ignore[index]

    def all_ready() -> bool:
        out = kubectl("get", "nodes", "-l", "pdfleet.dev/local-cluster=true", "-o",
                      "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=='Ready')].status}"
                      "{' '}{end}").stdout
        ready = {item.split("=")[0] for item in out.split() if item.endswith("=True")}
        return wanted <= ready

    _wait(f"{len(nodes)} fake nodes to become Ready", all_ready)

    def default_serviceaccount() -> bool:
        return kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

    _wait("the controller-manager to create the default ServiceAccount", default_serviceaccount)
    warm_ip_pools(sorted(wanted))
    say(f"{len(nodes)} fake nodes Ready ({sum('nvidia.com/gpu' in str(n) for n in nodes)} with GPUs)")


def warm_ip_pools(nodes: list[str]) -> None:
    """Has kwok give one pod on each node an IP, one node at a time. kwok (v0.8.0) makes a node's pool of pod IPs
    when it first needs one, with a check-then-store that is not atomic: pods started at the same moment on a
    node kwok has not given an IP yet can each make a pool of their own and get the same first address (seen:
    a new pool's prefill and decode pods both 127.1.2.1, one of them then waited for good for the other to stop).
    Once each node's pool exists, every later pod takes from it."""
    for node in nodes:
        name = f"pdfleet-ip-warmup-{node}"
        kubectl("create", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "warmup", "image": "pdfleet.invalid/warmup"}]}}))

        def has_ip(pod: str = name) -> bool:
            return bool(kubectl("get", "pod", pod, "-n", "default", "-o", "jsonpath={.status.podIP}").stdout)
        _wait(f"kwok to give a pod on {node} an IP", has_ip, timeout=60)
        kubectl("delete", "pod", name, "-n", "default", "--grace-period=0", "--force", "--wait=false")


# -------------------------------------------------------------------------------------------- commands


def say(msg: str) -> None:
    print(f"localcluster: {msg}", file=sys.stderr, flush=True)


def check_binaries(ports: Ports) -> None:
    missing = [c.binary for c in components(ports) if c.exe is None and not os.access(c.program, os.X_OK)]
    missing += [name for name in ("kubectl", "kueue") if not os.access(BIN / name, os.X_OK)]
    if missing:
        raise ClusterError(f"missing binaries in {BIN}: {', '.join(missing)}. Build them with `make binaries` "
                           f"(hack/build-binaries.sh; needs Go 1.24+).")
    if not os.access(sim_python(), os.X_OK):
        raise ClusterError(f"the pod runner's interpreter {sim_python()} does not exist. Install it with "
                           f"`make sglang` (or set PDFLEET_SIM_PYTHON to a Python with pdfleet and SGLang).")


ANSWER_PATIENCE_S = 60.0  # how long `up` waits for a running component to answer before it restarts it


def alive_and_answering(name: str, program: Path, ready: Callable[[], bool]) -> bool:
    """Whether our `name` runs and answers (`ready`), waiting for one that runs but is slow to (a busy machine):
    restarting it would fail whatever uses it meanwhile, and a restarted etcd starts empty."""
    pid = _alive_pid(name, program)
    deadline = time.monotonic() + ANSWER_PATIENCE_S
    while pid is not None and _alive_pid(name, program) == pid:
        if ready():
            return True
        if time.monotonic() > deadline:
            say(f"{name} (pid {pid}) did not answer for {ANSWER_PATIENCE_S:.0f} s: restarting it")
            return False
        time.sleep(1)
    return False


def up() -> None:
    if external_kubeconfig():
        kubectl("version")
        say(f"using the existing cluster of PDFLEET_KUBECONFIG={external_kubeconfig()}; starting nothing")
        return
    ports = Ports.from_env()
    check_binaries(ports)
    for sub in ("run", "logs"):
        (DIR / sub).mkdir(parents=True, exist_ok=True)
    ensure_pki()
    write_kubeconfig(ports)
    started = 0
    for c in components(ports):
        if alive_and_answering(c.name, c.program, c.ready):
            continue
        _stop(c.name, c.program)  # a process that is ours but does not answer is restarted
        if c.name == "etcd":
            # A fresh etcd starts empty: no pools, namespaces or events left by a run that was killed
            # without `down`. Components restarted while etcd runs keep the cluster's state.
            shutil.rmtree(DIR / "etcd", ignore_errors=True)
        _start(c)
        started += 1
    ensure_nodes()
    say("cluster is up" if started else "cluster was already up")
    _kueue().up()
    if _realnode().enabled():
        _realnode().up()
    print(f"export KUBECONFIG={DIR / 'kubeconfig'}")


def _kueue() -> types.ModuleType:
    """hack/kueue.py, which imports this module as `localcluster`: run as a script this module is `__main__`,
    so it is registered under its name first, or Kueue's tool would raise another copy's ClusterError."""
    sys.modules.setdefault("localcluster", sys.modules[__name__])
    sys.path.insert(0, str(HACK))
    import kueue
    return kueue


def _realnode() -> types.ModuleType:
    """hack/realnode.py (the kubelet node), imported as hack/kueue.py is."""
    sys.modules.setdefault("localcluster", sys.modules[__name__])
    sys.path.insert(0, str(HACK))
    import realnode
    return realnode


def down() -> None:
    if external_kubeconfig():
        say("PDFLEET_KUBECONFIG names an external cluster; stopping nothing")
        return
    ports = Ports.from_env()
    # Kueue (hack/kueue.py), when a test or a person started it against this control plane, goes first: it would
    # otherwise be left running against a cluster that is gone.
    stopped = int(_stop("kueue", BIN / "kueue"))
    # The real node next, while the apiserver still answers its kubelet; it removes its pods' sandboxes itself.
    _realnode().down()
    # Reversed: the pod runner stops first, and stops every pod's processes while the apiserver still runs.
    stopped += sum(_stop(c.name, c.program) for c in reversed(components(ports)))
    # A fresh etcd next time: no pools, nodes or events left over from an earlier run.
    shutil.rmtree(DIR / "etcd", ignore_errors=True)
    say(f"stopped {stopped} process(es)" if stopped else "nothing was running")


def status() -> int:
    if external_kubeconfig():
        return kubectl("cluster-info", check=False).returncode
    ports = Ports.from_env()
    running = 0
    for c in components(ports):
        pid = _alive_pid(c.name, c.program)
        state = f"running (pid {pid})" if pid else "stopped"
        running += pid is not None
        print(f"{c.name:24} {state}")
    kueue = _kueue().status() == 0
    node = _realnode().status() == 0 if _realnode().enabled() else True
    return 0 if running == len(components(ports)) and kueue and node else 1


def env() -> None:
    print(f"export KUBECONFIG={kubeconfig_path()}")
    print(f"export PATH={BIN}:$PATH")


def pinned(name: str) -> str:
    """A version pinned in hack/versions.env (`NAME=value` lines), the one place the local cluster's tools are
    pinned."""
    for line in (HACK / "versions.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1].strip()
    raise ClusterError(f"{name} is not pinned in {HACK / 'versions.env'}")


def run_command(tool: str, doc: str, commands: dict[str, Callable[[list[str]], int | None]],
                argv: list[str] | None) -> int:
    """The command line of the local cluster's tools: `TOOL COMMAND [ARGS...]`, a ClusterError printed as one
    line and exit 1, a command's own exit code (None: 0)."""
    parser = argparse.ArgumentParser(prog=tool, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(commands))
    parser.add_argument("args", nargs="*")
    args = parser.parse_args(argv)
    try:
        return commands[args.command](args.args) or 0
    except ClusterError as e:
        print(f"{tool}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    return run_command("localcluster", __doc__ or "", {
        "up": lambda _: up(), "down": lambda _: down(), "env": lambda _: env(), "status": lambda _: status(),
        "nodes": lambda _: ensure_nodes(),
    }, argv)


if __name__ == "__main__":
    sys.exit(main())
