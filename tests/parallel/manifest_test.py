"""Checks deploy/kubernetes/parallel-job.yaml: its documents parse, and the
rank count, rendezvous address and job spec agree with each other."""
import os
import sys

import yaml

root = os.path.join(os.environ.get("TEST_SRCDIR", "."), "ferry")
path = os.path.join(root, "deploy/kubernetes/parallel-job.yaml")
docs = {d["kind"]: d for d in yaml.safe_load_all(open(path))}
assert set(docs) == {"ConfigMap", "Service", "Job"}, sorted(docs)

job, service, config = docs["Job"], docs["Service"], docs["ConfigMap"]
spec = yaml.safe_load(config["data"]["job.yaml"])
parallel = spec["parallel"]
ranks = parallel["tensor"] * parallel["data"]
pod = job["spec"]["template"]["spec"]
env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}

assert job["spec"]["completionMode"] == "Indexed"
assert job["spec"]["completions"] == job["spec"]["parallelism"] == ranks == int(env["WORLD_SIZE"]), (ranks, env)
assert pod["subdomain"] == service["metadata"]["name"]
assert service["spec"]["clusterIP"] == "None"
assert env["MASTER_ADDR"] == "%s-0.%s" % (job["metadata"]["name"], service["metadata"]["name"]), env
assert int(env["MASTER_PORT"]) == service["spec"]["ports"][0]["port"]
assert "JOB_COMPLETION_INDEX" in pod["containers"][0]["args"][0]
mount = pod["containers"][0]["volumeMounts"][0]["mountPath"]
assert "--spec=%s/job.yaml" % mount in pod["containers"][0]["args"][0]
assert pod["volumes"][0]["configMap"]["name"] == config["metadata"]["name"]
assert spec["model"]["preset"] and spec["data"], spec
print("manifest ok: %d ranks, rendezvous at %s:%s" % (ranks, env["MASTER_ADDR"], env["MASTER_PORT"]))
