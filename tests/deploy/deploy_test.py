"""Checks what deploy/ ships against itself and against the binaries it
runs: the systemd unit (systemd-analyze verify, flags ferryd knows), the
Kubernetes manifests (labels, selectors, named ports, probes, volumes,
flags) and the container image definition (flags, Debian packages that
exist). Nothing here needs a cluster or a container engine."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

root = os.path.join(os.environ.get("TEST_SRCDIR", "."), "ferry")
ferryd = os.path.join(root, "server/ferryd")
help_text = subprocess.run([ferryd, "--helpfull"], capture_output=True, text=True).stdout
known = set(re.findall(r"--([a-z_]+)", help_text))
assert {"state_dir", "listen", "tokens_file"} <= known, sorted(known)[:20]


def check_flags(args, where):
    for arg in args:
        for flag in re.findall(r"(?:^|\s)--([a-z_]+)", arg):
            assert flag in known, "%s: ferryd has no --%s" % (where, flag)


# --- systemd ---
unit_path = os.path.join(root, "deploy/systemd/ferryd.service")
unit = open(unit_path).read()
assert re.search(r"^Type=notify$", unit, re.M), "the unit must wait for ferryd's READY=1"
assert re.search(r"^Restart=on-failure$", unit, re.M)
assert re.search(r"^StateDirectory=ferry$", unit, re.M) and re.search(r"^ConfigurationDirectory=ferry$", unit, re.M)
exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
check_flags([exec_start], "ferryd.service")
grace = int(re.search(r"--stop_grace_seconds=(\d+)", exec_start).group(1))
stop = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))
assert stop >= grace + 15, "TimeoutStopSec=%d leaves no room for a %d s drain" % (stop, grace)
with tempfile.TemporaryDirectory() as tmp:
    local = os.path.join(tmp, "ferryd.service")
    open(local, "w").write(unit.replace(exec_start.split()[0], ferryd))
    verify = subprocess.run(["systemd-analyze", "verify", local], capture_output=True, text=True)
    complaints = [l for l in (verify.stdout + verify.stderr).splitlines() if "ferryd.service" in l]
    assert verify.returncode == 0 and not complaints, verify.stdout + verify.stderr

# ferryd speaks systemd's notify protocol: READY=1 once serving, STOPPING=1
# when it drains (what Type=notify waits for).
import socket
import time

with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
    sock_path = os.path.join(tmp, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(120)
    env = dict(os.environ, NOTIFY_SOCKET=sock_path)
    daemon = subprocess.Popen([ferryd, "--state_dir=%s/state" % tmp, "--listen=127.0.0.1:0", "--metrics_listen=",
                               "--ready_file=%s/ready.json" % tmp], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ready = sock.recv(4096).decode()
        assert ready.startswith("READY=1\nSTATUS=serving on 127.0.0.1:"), ready
        assert os.path.exists(os.path.join(tmp, "ready.json")), "READY=1 came before ferryd was serving"
        daemon.terminate()
        stopping = sock.recv(4096).decode()
        assert stopping.startswith("STOPPING=1"), stopping
        assert daemon.wait(60) == 0
    finally:
        daemon.kill()
        daemon.wait()

# --- Kubernetes ---
docs = []
for path in sorted(glob.glob(os.path.join(root, "deploy/kubernetes/*.yaml"))):
    docs += [(os.path.basename(path), d) for d in yaml.safe_load_all(open(path)) if d]
by_kind = {}
for name, d in docs:
    assert d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"), (name, d)
    by_kind.setdefault(d["kind"], []).append(d)
ds = [d for d in by_kind["DaemonSet"] if d["metadata"]["name"] == "ferryd"][0]
pod = ds["spec"]["template"]
labels = pod["metadata"]["labels"]
assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
container = pod["spec"]["containers"][0]
check_flags(container["args"], "ferryd.yaml")
ports = {p["name"]: p["containerPort"] for p in container["ports"]}
assert set(ports) == {"grpc", "metrics"}, ports
listen = [a for a in container["args"] if a.startswith("--listen=")][0]
assert listen.endswith(":%d" % ports["grpc"]), listen
metrics = [a for a in container["args"] if a.startswith("--metrics_listen=")][0]
assert metrics.endswith(":%d" % ports["metrics"]), metrics
for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
    assert container[probe]["grpc"]["port"] == ports["grpc"], probe
volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
for mount in container["volumeMounts"]:
    assert mount["name"] in volumes, mount
state = [a for a in container["args"] if a.startswith("--state_dir=")][0].split("=", 1)[1]
assert any(m["mountPath"] == state and "hostPath" in volumes[m["name"]] for m in container["volumeMounts"]), \
    "the state directory must outlive the pod"
tokens = [a for a in container["args"] if a.startswith("--tokens_file=")][0].split("=", 1)[1]
assert any(tokens.startswith(m["mountPath"] + "/") and "secret" in volumes[m["name"]] for m in container["volumeMounts"])
assert pod["spec"]["terminationGracePeriodSeconds"] >= grace + 15
service = [d for d in by_kind["Service"] if d["metadata"]["name"] == "ferryd"][0]
assert service["spec"]["selector"].items() <= labels.items()
service_ports = {p["name"]: p for p in service["spec"]["ports"]}
assert set(service_ports) == set(ports) and all(p["targetPort"] in ports for p in service_ports.values())
monitor = by_kind["ServiceMonitor"][0]
assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
assert all(e["port"] in service_ports for e in monitor["spec"]["endpoints"])
dashboards = glob.glob(os.path.join(root, "deploy/grafana/dashboards/*.json"))
maps = [d for d in by_kind.get("ConfigMap", []) if d["metadata"].get("labels", {}).get("grafana_dashboard")]
if dashboards:
    assert maps, "no dashboard ConfigMap in deploy/kubernetes"
    shipped = {os.path.basename(p): json.load(open(p)) for p in dashboards}
    for m in maps:
        for key, text in m["data"].items():
            assert key in shipped, key
            assert json.loads(text) == shipped[key], "%s in the ConfigMap differs from deploy/grafana" % key

# --- container image ---
dockerfile = open(os.path.join(root, "deploy/container/Dockerfile")).read().replace("\\\n", " ")
entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
check_flags(entry[1:], "Dockerfile")
names = re.search(r'^ARG DEBIAN_RUNTIME="([^"]*)"$', dockerfile, re.M).group(1).split()
if shutil.which("apt-cache"):
    missing = [n for n in names if subprocess.run(["apt-cache", "show", n], capture_output=True).returncode != 0]
    assert not missing, "Debian 12 has no package %s" % missing
print("deploy ok: systemd unit verified, READY=1 and STOPPING=1 received; %d Kubernetes objects; image flags and %d runtime packages checked"
      % (len(docs), len(names)))
