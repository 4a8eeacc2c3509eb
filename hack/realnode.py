#!/usr/bin/env python3
"""A real node for the local cluster: kubelet, containerd and runc, beside kwok's fake nodes.

Pods scheduled on it run in real containers (image pulls, init containers, volumes, probes, SIGTERM and grace
periods are the kubelet's own), which is how pdfleet's images are tried end to end on a machine without a
container engine. Run by hack/localcluster.py `up` and `down` (PDFLEET_REAL_NODE=0 leaves it out).

    realnode.py up      start what is not running (idempotent), register the node, wait until it is Ready
    realnode.py down    remove its pods' sandboxes, stop its processes, delete its network namespace
    realnode.py status  say what runs
    realnode.py push ARCHIVE REF   copy an OCI archive into the node's registry as REF (a real pull then finds it)
    realnode.py push-built [NAME...]  push the images `make images` built (all by default), each under its own
                                      name (`make images-push`)

Network: the node lives in a network namespace the cluster makes (`pdfleet-node`), with no link and no route out
of it. Its pods sit on a bridge in that namespace (POD_SUBNET); nothing outside 127.0.0.0/8 is ever sent to but
addresses inside it. hack/netns_proxy.py joins it to the host's loopback at three points:
- the apiserver: the node and its pods reach it at the `kubernetes` Service's address (API_VIP:443, an address
  of the namespace's own loopback), as pods of a real cluster do;
- the kubelet: the apiserver reaches it (logs, exec, port-forward) at 127.0.0.1:PDFLEET_KUBELET_PORT, the
  node's InternalIP, which this tool sets as a cloud provider would (the kubelet runs with
  --cloud-provider=external, so it takes the address it is given instead of looking for one of its own);
- the registry: containerd pulls every image from a registry on the host's loopback (Debian's docker-registry),
  mirrored for every registry name, so `ghcr.io/pdfleet/...` in a chart is a real pull of what `make images`
  built and pushed there, and a name nobody pushed fails as ErrImagePull.

Standard library only. Needs root (network namespaces, mounts, cgroups) and Debian's containerd, runc,
containernetworking-plugins, docker-registry, skopeo and catatonit (for the sandbox image), plus crictl and
kubelet from hack/build-binaries.sh.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import localcluster as lc  # beside this file; hack/ is not a package
import netns_proxy
from images import oci  # hack/images/: `make images`' OCI writer

NETNS = os.environ.get("PDFLEET_NODE_NETNS", "pdfleet-node")
NODE_NAME = "pdfleet-real-0"
POD_SUBNET = "10.244.0.0/24"  # only inside the node's network namespace
API_VIP = str(next(ipaddress.ip_network(lc.SERVICE_CIDR).hosts()))  # the `kubernetes` Service's ClusterIP
DNS_VIP = str(ipaddress.ip_network(lc.SERVICE_CIDR)[10])  # no DNS server answers there: lookups fail at once
NODE_REGISTRY = "127.0.0.1:5000"  # the registry as containerd sees it, inside the namespace
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
# A pod lands here only if it asks to: every other pod of the suite belongs on kwok's nodes.
TAINT = {"key": "pdfleet.dev/real-node", "value": "true", "effect": "NoSchedule"}
LABEL = "pdfleet.dev/real-node"
FAKE_GPUS = 4  # what engine pods request; the node has none, the CPU engine image simulates the engine
PACKAGES = {  # a program we need -> the Debian package that has it
    "containerd": "containerd", "runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins",
    "docker-registry": "docker-registry", "skopeo": "skopeo", "catatonit": "catatonit", "nsenter": "util-linux",
    "ip": "iproute2", "ctr": "containerd",
}

NODE_DIR = lc.DIR / "node"
RUN = Path("/run/pdfleet") / NETNS  # short: unix socket paths are limited to 107 bytes
CONTAINERD_SOCK = RUN / "containerd.sock"
REGISTRY_DIR = lc.CACHE / "registry"  # outlives the cluster: pushed images are kept, as built ones are


def kubelet_port() -> int:
    return lc._port("PDFLEET_KUBELET_PORT", 20250)


def registry_port() -> int:
    return lc._port("PDFLEET_REGISTRY_PORT", 20260)


def enabled() -> bool:
    return os.environ.get("PDFLEET_REAL_NODE", "1") not in ("0", "false", "no")


def say(msg: str) -> None:
    print(f"realnode: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- preconditions


def _have(program: str) -> bool:
    return os.access(program, os.X_OK) if program.startswith("/") else shutil.which(program) is not None


def missing_packages() -> list[str]:
    return sorted({pkg for prog, pkg in PACKAGES.items() if not _have(prog)})


def check_installed() -> None:
    if os.geteuid() != 0:
        raise lc.ClusterError("the real node needs root (network namespaces, mounts, cgroups). Run as root, or "
                              "leave the node out with PDFLEET_REAL_NODE=0.")
    if missing := missing_packages():
        raise lc.ClusterError(f"the real node needs Debian packages that are not installed: {' '.join(missing)}. "
                              f"Install them (apt-get install {' '.join(missing)}; `make node-deps` does), or "
                              f"leave the node out with PDFLEET_REAL_NODE=0.")
    absent = [b for b in ("kubelet", "crictl") if not os.access(lc.BIN / b, os.X_OK)]
    if absent:
        raise lc.ClusterError(f"missing binaries in {lc.BIN}: {', '.join(absent)}. Build them with `make binaries`.")


# ----------------------------------------------------------------------------------------- the namespace


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(cmd, text=True, capture_output=True)
    if check and proc.returncode != 0:
        raise lc.ClusterError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def netns_exists() -> bool:
    return Path("/run/netns", NETNS).exists()


def ensure_netns() -> None:
    """The node's namespace: loopback up, the apiserver's Service address on it, no other link and no route."""
    if not netns_exists():
        _ip("netns", "add", NETNS)
    _ip("link", "set", "lo", "up", netns=NETNS)
    addrs = _ip("-j", "addr", "show", "dev", "lo", netns=NETNS).stdout
    have = {a["local"] for link in json.loads(addrs) for a in link.get("addr_info", [])}
    for vip in (API_VIP, DNS_VIP):
        if vip not in have:
            _ip("addr", "add", f"{vip}/32", "dev", "lo", netns=NETNS)


# On the host, these ranges lead nowhere: a host process given a pod IP of the node (an operator run as a local
# process, reading an engine's rank health) or a Service address fails at once, instead of sending it out of the
# machine along the host's default route.
GUARDED = (POD_SUBNET, lc.SERVICE_CIDR)


def guard_host_routes() -> None:
    for net in GUARDED:
        _ip("route", "replace", "unreachable", net)


def unguard_host_routes() -> None:
    for net in GUARDED:
        _ip("route", "delete", "unreachable", net, check=False)


def in_netns() -> tuple[str, ...]:
    """The launcher of a process of the node: its network namespace, the host's mount namespace (the kubelet's
    volume mounts must be the ones containerd bind-mounts into containers; `ip netns exec` would give each
    its own)."""
    return ("nsenter", f"--net=/run/netns/{NETNS}", "--")


# ------------------------------------------------------------------------------------------------ config


def write_configs() -> None:
    for d in (NODE_DIR / "cni", NODE_DIR / "certs.d" / "_default", NODE_DIR / "kubelet", RUN):
        d.mkdir(parents=True, exist_ok=True)
    (NODE_DIR / "containerd.toml").write_text(f"""version = 2
root = "{NODE_DIR / 'containerd'}"
state = "{RUN / 'containerd'}"
[grpc]
  address = "{CONTAINERD_SOCK}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  # Lowering a process's OOM score takes CAP_SYS_RESOURCE, which a root in a container or micro-VM may not hold:
  # the pause container's -998 would then fail every sandbox. Scores are kept no lower than containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{RUN / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{NODE_DIR / 'cni'}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{NODE_DIR / 'certs.d'}"
""")
    (NODE_DIR / "cni" / "10-pdfleet.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "pdfleet-node",
        "plugins": [{"type": "bridge", "bridge": "pdfleet0", "isGateway": True, "ipMasq": False,
                     "hairpinMode": True,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                              "dataDir": str(RUN / "ipam"), "routes": [{"dst": "0.0.0.0/0"}]}}],
    }, indent=2))
    # Every registry name resolves to the local registry: nothing is pulled from anywhere else.
    (NODE_DIR / "certs.d" / "_default" / "hosts.toml").write_text(
        f'server = "http://{NODE_REGISTRY}"\n\n[host."http://{NODE_REGISTRY}"]\n  capabilities = ["pull", "resolve"]\n')
    for name in ("docker.io", "ghcr.io", "registry.k8s.io", "quay.io", "nvcr.io"):
        (NODE_DIR / "certs.d" / name).mkdir(exist_ok=True)
        shutil.copy(NODE_DIR / "certs.d" / "_default" / "hosts.toml", NODE_DIR / "certs.d" / name / "hosts.toml")
    (NODE_DIR / "registry.yml").write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {REGISTRY_DIR}\n"
        f"  delete:\n    enabled: true\nhttp:\n  addr: {lc.HOST}:{registry_port()}\n")
    (NODE_DIR / "resolv.conf").write_text(f"nameserver {DNS_VIP}\n")
    pki = lc.DIR / "pki"
    lc.issue_client("node", f"/O=system:nodes/CN=system:node:{NODE_NAME}")
    lc.write_file(NODE_DIR / "kubeconfig", f"""apiVersion: v1
kind: Config
clusters:
- name: pdfleet-local
  cluster:
    server: https://{API_VIP}:443
    certificate-authority: {pki / "ca.crt"}
users:
- name: {NODE_NAME}
  user:
    client-certificate: {pki / "node.crt"}
    client-key: {pki / "node.key"}
contexts:
- name: node
  context: {{cluster: pdfleet-local, user: {NODE_NAME}}}
current-context: node
""", mode=0o600)
    (NODE_DIR / "kubelet.yaml").write_text(json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": "127.0.0.1", "port": kubelet_port(), "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(pki / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "failSwapOn": False, "resolvConf": str(NODE_DIR / "resolv.conf"),
        "clusterDomain": "cluster.local", "clusterDNS": [DNS_VIP],
        "registerWithTaints": [TAINT],
        # A shared development machine: never evict pods for the host's disk or memory, and never collect
        # the images a test just pushed.
        "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "syncFrequency": "10s", "fileCheckFrequency": "0s",
        "nodeStatusUpdateFrequency": "5s", "shutdownGracePeriod": "0s", "logging": {"verbosity": 1},
        "localStorageCapacityIsolation": True, "maxPods": 30,
    }, indent=2))


# --------------------------------------------------------------------------------------------- processes


def _netns_http_ok(url: str) -> bool:
    try:
        with netns_proxy.entered(NETNS), urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _unix_ok(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def components() -> list[lc.Component]:
    ports = lc.Ports.from_env()
    proxy = [f"--forward={NETNS}:{API_VIP}:443=host:{lc.HOST}:{ports.apiserver}",
             f"--forward={NETNS}:{NODE_REGISTRY}=host:{lc.HOST}:{registry_port()}",
             f"--forward=host:{lc.HOST}:{kubelet_port()}={NETNS}:127.0.0.1:{kubelet_port()}"]
    return [
        lc.Component("registry", "docker-registry", registry_port(), "PDFLEET_REGISTRY_PORT",
                     ["serve", str(NODE_DIR / "registry.yml")],
                     lambda: lc._http_ok(registry_port(), "/v2/"),
                     exe=Path(shutil.which("docker-registry") or "/usr/bin/docker-registry")),
        lc.Component("node-proxy", "netns_proxy", kubelet_port(), "PDFLEET_KUBELET_PORT", proxy,
                     lambda: _netns_http_ok(f"http://{NODE_REGISTRY}/v2/"),
                     # Known by its script, whichever interpreter runs it (`down` may run under another).
                     exe=lc.HACK / "netns_proxy.py", launcher=(sys.executable,)),
        lc.Component("containerd", "containerd", None, "", ["--config", str(NODE_DIR / "containerd.toml")],
                     lambda: _unix_ok(CONTAINERD_SOCK), exe=Path(shutil.which("containerd") or "containerd"),
                     launcher=in_netns()),
        lc.Component("kubelet", "kubelet", None, "", [
            f"--config={NODE_DIR / 'kubelet.yaml'}", f"--kubeconfig={NODE_DIR / 'kubeconfig'}",
            f"--root-dir={NODE_DIR / 'kubelet'}", f"--cert-dir={NODE_DIR / 'kubelet' / 'pki'}",
            f"--hostname-override={NODE_NAME}", "--cloud-provider=external",
            f"--node-labels={LABEL}=true,nvidia.com/gpu.present=true,nvidia.com/gpu.product=pdfleet-cpu-simulated",
        ], lambda: _netns_http_ok("http://127.0.0.1:10248/healthz"), launcher=in_netns()),
    ]


def sandbox_image() -> Path:
    """The pause image every pod's sandbox runs: catatonit (Debian's, static) in its pause mode, one layer,
    written by `make images`' own OCI writer (hack/images/oci.py, standard library only)."""
    out = NODE_DIR / "pause.oci.tar"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "root").mkdir()
        shutil.copy(shutil.which("catatonit") or "/usr/bin/catatonit", work / "root" / "pause")
        (work / "root" / "pause").chmod(0o755)
        layer = oci.write_layer(work / "root", work / "layer", gzip_level=None)
        blob = oci.blob_path(work / "blobs", layer.descriptor.digest)
        blob.parent.mkdir(parents=True)
        (work / "layer").rename(blob)
        config = oci.config_document(oci.ImageConfig(user="65535:65535", entrypoint=("/pause", "-P")), [layer],
                                     ["catatonit -P, Debian's static build"])
        oci.write_archive(out, work / "blobs", SANDBOX_IMAGE, config, [layer])
    return out


def ctr(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ctr", "--address", str(CONTAINERD_SOCK), "--namespace", "k8s.io", *args],
                          text=True, capture_output=True)
    if check and proc.returncode != 0:
        raise lc.ClusterError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def crictl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(lc.BIN / "crictl"), "--runtime-endpoint", f"unix://{CONTAINERD_SOCK}",
                           "--timeout", "30s", *args], text=True, capture_output=True)
    if check and proc.returncode != 0:
        raise lc.ClusterError(f"crictl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def ensure_sandbox_image() -> None:
    if SANDBOX_IMAGE not in ctr("images", "ls", "-q").stdout.split():
        ctr("images", "import", str(sandbox_image()))


# ------------------------------------------------------------------------------------------------ the node


def node() -> dict | None:
    proc = lc.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def initialize_node() -> None:
    """What a cloud provider's node controller does for a kubelet with --cloud-provider=external: the node's
    address (the host end of the kubelet's forward), then the `uninitialized` taint off. And the fake GPUs
    engine pods request, as an extended resource the kubelet keeps (no device plugin owns it)."""
    lc._wait(f"the kubelet to register node {NODE_NAME}", lambda: node() is not None)
    current = node() or {}
    status = {"addresses": [{"type": "InternalIP", "address": lc.HOST}, {"type": "Hostname", "address": NODE_NAME}],
              "capacity": {"nvidia.com/gpu": str(FAKE_GPUS)}}
    lc.kubectl("patch", "node", NODE_NAME, "--subresource=status", "--type=merge", "-p",
               json.dumps({"status": status}))
    taints = [t for t in current.get("spec", {}).get("taints", [])
              if t["key"] != "node.cloudprovider.kubernetes.io/uninitialized"]
    # Only its own taint (no GPU one): the operator's pods, which tolerate no GPU taint, may run here too.
    if not any(t["key"] == TAINT["key"] for t in taints):
        taints.append(TAINT)
    lc.kubectl("patch", "node", NODE_NAME, "--type=merge", "-p", json.dumps({"spec": {"taints": taints}}))

    def ready() -> bool:
        n = node() or {}
        conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
        gpus = n.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")
        return conds.get("Ready") == "True" and gpus == str(FAKE_GPUS)

    lc._wait(f"node {NODE_NAME} to be Ready", ready, timeout=120)


# ------------------------------------------------------------------------------------------------ commands


def _owner_mark() -> Path:
    """Written by `up`: this cluster directory made the node's namespace and runtime directory, so its `down`
    removes them (a private cluster of the tests, with the node left out, never touches the shared one's)."""
    return lc.DIR / "run" / "realnode.netns"


def up() -> None:
    check_installed()
    for sub in ("run", "logs"):
        (lc.DIR / sub).mkdir(parents=True, exist_ok=True)
    _owner_mark().write_text(f"{NETNS}\n")
    guard_host_routes()
    ensure_netns()
    comps = {c.name: c for c in components()}
    if not any(lc._alive_pid(name, comps[name].program) for name in ("containerd", "kubelet")):
        # Neither runs: whatever an earlier node left (its processes killed, as at the end of a session, without
        # `down`) is stale: sandboxes' shims, the kubelet's volume mounts and pod state, the containers' state.
        clear_runtime_state()
    write_configs()
    for c in components():
        if lc.alive_and_answering(c.name, c.program, c.ready):
            continue
        lc._stop(c.name, c.program)
        if c.name == "containerd":
            lc._start(c)
            ensure_sandbox_image()
            continue
        lc._start(c)
    initialize_node()
    say(f"node {NODE_NAME} Ready (real kubelet and containerd, network namespace {NETNS})")


def _mounts_under(root: Path) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == str(root) or point.startswith(f"{root}/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def down() -> None:
    if not _owner_mark().exists():
        return
    comps = {c.name: c for c in components()}
    stopped = lc._stop("kubelet", comps["kubelet"].program)
    if lc._alive_pid("containerd", comps["containerd"].program) and os.access(lc.BIN / "crictl", os.X_OK):
        # Sandboxes removed through the CRI: their containers killed, CNI told (their IPs freed), their
        # network namespaces unmounted.
        for pod in crictl("pods", "-q", check=False).stdout.split():
            crictl("stopp", pod, check=False)
            crictl("rmp", "--force", pod, check=False)
    for name in ("containerd", "node-proxy", "registry"):
        stopped |= lc._stop(name, comps[name].program)
    clear_runtime_state()
    if netns_exists():
        _ip("netns", "delete", NETNS, check=False)
        stopped = True
    unguard_host_routes()
    _owner_mark().unlink(missing_ok=True)
    say(f"node {NODE_NAME} stopped" if stopped else "nothing was running")


def clear_runtime_state() -> None:
    """The node's runtime state gone (kept: containerd's images, the registry): its shims killed, the kubelet's
    volume mounts and the containers' mounts unmounted, the kubelet's pod state and containerd's state removed."""
    _kill_shims()
    for point in _mounts_under(NODE_DIR / "kubelet") + _mounts_under(RUN):
        subprocess.run(["umount", "-l", point], capture_output=True)
    shutil.rmtree(NODE_DIR / "kubelet", ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)


def _kill_shims() -> None:
    """containerd's shims outlive it by design; ours (those of our socket) go with the node."""
    needle = str(CONTAINERD_SOCK).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (proc / "cmdline").read_bytes()
            if b"containerd-shim" in cmd and needle in cmd:
                os.kill(int(proc.name), 9)


def status() -> int:
    running = 0
    for c in components():
        pid = lc._alive_pid(c.name, c.program)
        running += pid is not None
        print(f"{c.name:24} {f'running (pid {pid})' if pid else 'stopped'}")
    return 0 if running == len(components()) else 1


def push(archive: Path, ref: str) -> str:
    """Copy an OCI archive into the node's registry as `ref` (registry host dropped: every name is mirrored
    there); returns the digest the registry holds."""
    repo = ref.split("/", 1)[1] if "." in ref.split("/", 1)[0] or ":" in ref.split("/", 1)[0] else ref
    dest = f"docker://{lc.HOST}:{registry_port()}/{repo}"
    proc = subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--preserve-digests",
                           f"oci-archive:{archive}", dest], text=True, capture_output=True)
    if proc.returncode != 0:
        raise lc.ClusterError(f"skopeo copy {archive} -> {dest} failed: {proc.stderr.strip()}")
    inspect = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", dest], capture_output=True)
    digest = "sha256:" + hashlib.sha256(inspect.stdout).hexdigest()
    forget_stale(ref, digest)
    return digest


def forget_stale(ref: str, digest: str) -> None:
    """The node's containerd forgets its copy of `ref` when that is not `digest`: a pod asking for a tag it already
    holds is never pulled again (IfNotPresent, the default for a tag), so it would go on running an earlier build
    of the same name. Containers already running keep their image."""
    if not CONTAINERD_SOCK.exists():
        return  # the node is down: its containerd pulls afresh whatever is asked next
    listed = ctr("images", "ls", f"name=={ref}", check=False).stdout.splitlines()[1:]
    held = [line.split()[2] for line in listed if len(line.split()) > 2]
    if held and held[0] != digest:
        ctr("images", "rm", ref, check=False)
        say(f"{ref}: the node forgot its copy {held[0][:19]}, the next pod pulls {digest[:19]}")


def push_built(names: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """The images of `make images`' index (all, or `names`) pushed into the node's registry under their own
    references (ghcr.io/pdfleet/...: the node mirrors every registry name there), each checked to hold the very
    digest the build made. Returns name -> (reference, digest)."""
    index_path = lc.CACHE / "images" / "index.json"
    if not index_path.exists():
        raise lc.ClusterError(f"no images built ({index_path} is missing): run `make images` first")
    index = json.loads(index_path.read_text())["images"]
    if missing := sorted(set(names or ()) - set(index)):
        raise lc.ClusterError(f"not built: {', '.join(missing)} (not in {index_path}): run `make images`")
    out = {}
    for name in sorted(names or index):
        entry = index[name]
        held = push(Path(entry["archive"]), entry["reference"])
        if held != entry["digest"]:
            raise lc.ClusterError(f"the registry holds {held} for {name}, the build made {entry['digest']}")
        say(f"{entry['reference']}@{held} pushed")
        out[name] = (entry["reference"], held)
    return out


def _push(args: list[str]) -> None:
    if len(args) != 2:
        raise lc.ClusterError("usage: realnode.py push ARCHIVE REF")
    print(push(Path(args[0]), args[1]))


def _push_built(names: list[str]) -> None:
    push_built(names or None)


def main(argv: list[str] | None = None) -> int:
    return lc.run_command("realnode", __doc__ or "", {
        "up": lambda _: up(), "down": lambda _: down(), "status": lambda _: status(), "push": _push,
        "push-built": _push_built,
    }, argv)


if __name__ == "__main__":
    sys.exit(main())
