#!/usr/bin/env python3
"""Submits a training job to ferryd, watches it to the end and prints where its
model data lived.

    PYTHONPATH=bazel-bin/proto/python python3 client/python/ferry_client.py \\
        [JOB.yaml] [--steps=50] [--address=HOST:PORT] [--token=TOKEN] \\
        [--tls-ca=CA.pem [--tls-cert=CLIENT.pem --tls-key=CLIENT.key]]

The watch survives a lost connection: it resumes after the last event it got,
or, when the daemon no longer has that event, starts again from a snapshot.
Exit codes: 0 the job succeeded, 1 it failed or was cancelled, 2 bad usage or
a refused request, 3 the daemon could not be reached.
"""

import argparse
import os
import re
import sys
import time
import uuid

import grpc
from google.protobuf import json_format

from ferry.v1 import ferry_pb2, ferry_pb2_grpc, job_pb2, options_pb2, spec_pb2

ENDED = {job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED}
SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class Failure(Exception):
    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


def state_name(state):
    return job_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def fail_rpc(what, err):
    code = 3 if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 2
    return Failure(f"{what}: {err.code().name.lower().replace('_', ' ')}: {err.details()}", code)


def open_channel(args):
    """A channel to ferryd: TLS when a CA or a client certificate is given
    (as the ferry CLI), else plaintext."""
    # Retry a lost connection at least every 2 s (gRPC's default backs off to 2 minutes).
    options = [("grpc.max_reconnect_backoff_ms", 2000)]
    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return grpc.insecure_channel(args.address, options=options)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise Failure("--tls-cert and --tls-key go together (a client certificate and its key)")

    def read(flag, path):
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise Failure(f"{flag}={path}: {e.strerror}")

    credentials = grpc.ssl_channel_credentials(root_certificates=read("--tls-ca", args.tls_ca),
                                               private_key=read("--tls-key", args.tls_key),
                                               certificate_chain=read("--tls-cert", args.tls_cert))
    return grpc.secure_channel(args.address, credentials, options=options)


def job_file_to_json(value, descriptor, base_dir):
    """Turns a job file's YAML into JobSpec's JSON mapping, in place: short enum
    names (fp32), sizes with units (512MiB) and paths relative to the file."""
    for key, v in value.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None:
            continue  # ParseDict names the unknown field
        options = field.GetOptions()
        if field.message_type is not None and isinstance(v, dict):
            job_file_to_json(v, field.message_type, base_dir)
        elif field.enum_type is not None and isinstance(v, str):
            names = [n for n in field.enum_type.values_by_name if n.endswith("_" + v.upper())]
            value[key] = names[0] if len(names) == 1 else v
        elif options.Extensions[options_pb2.size_bytes] and isinstance(v, str):
            m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", v)
            if not m or m.group(2).upper() not in SIZE_UNITS:
                raise Failure(f"{key}: '{v}' is not a size such as 512MiB or 4GiB")
            value[key] = int(float(m.group(1)) * SIZE_UNITS[m.group(2).upper()])
        elif options.Extensions[options_pb2.path] and isinstance(v, str):
            value[key] = os.path.join(base_dir, v)


def build_spec(args):
    spec = spec_pb2.JobSpec()
    if args.job_file:
        import yaml  # python3-yaml; only needed for job files
        try:
            with open(args.job_file, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
            if not isinstance(doc, dict):
                raise Failure(f"{args.job_file}: a job file is a mapping such as 'train: {{steps: 50}}'")
            job_file_to_json(doc, spec.DESCRIPTOR, os.path.dirname(os.path.abspath(args.job_file)))
            json_format.ParseDict(doc, spec)
        except (OSError, yaml.YAMLError, json_format.ParseError) as e:
            raise Failure(f"cannot read the job file {args.job_file}: {e}")
    if args.name or not spec.name:
        spec.name = args.name or "python-example"
    if args.preset:
        spec.model.preset = args.preset
    for field in ("layers", "hidden", "heads"):
        if getattr(args, field):
            setattr(spec.model, field, getattr(args, field))
    if args.steps:
        spec.train.steps = args.steps
    if args.batch_size:
        spec.train.batch_size = args.batch_size
    if args.data:
        spec.data.path = os.path.abspath(args.data)
    if spec.data.WhichOneof("source") is None:
        spec.data.synthetic.SetInParent()
    if args.checkpoint_dir:
        spec.checkpoint.dir = os.path.abspath(args.checkpoint_dir)
    return spec


def submit(stub, spec, metadata):
    request = ferry_pb2.SubmitJobRequest(spec=spec, request_id=str(uuid.uuid4()))
    for attempt in range(5):  # the request_id makes a retry safe
        try:
            return stub.SubmitJob(request, metadata=metadata, timeout=30)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAVAILABLE or attempt == 4:
                raise fail_rpc("submit", err)
            time.sleep(1)


def print_event(event):
    kind = event.WhichOneof("kind")
    if kind == "progress":
        p = event.progress
        print(f"step {p.step}/{p.total_steps}  loss {p.loss:.4f}  {p.tokens_per_second:.0f} tok/s"
              f"  device {p.device_memory_bytes / 2**20:.1f} MiB  (seq {event.seq})", flush=True)
    elif kind == "state_change":
        c = event.state_change
        reason = f": {c.reason}" if c.reason else ""
        print(f"{state_name(getattr(c, 'from'))} -> {state_name(c.to)}{reason}  (seq {event.seq})", flush=True)
    elif kind == "log":
        print(f"log: {event.log.message}", flush=True)


def watch(stub, job_id, metadata, reconnect_seconds):
    """Prints the job's events until it ends, reconnecting as needed."""
    last_seq = 0  # the newest event printed; 0: none yet, start from a snapshot
    lost_since = None
    while True:
        after = last_seq
        try:
            for event in stub.WatchJob(ferry_pb2.WatchJobRequest(job_id=job_id, after_seq=after),
                                       metadata=metadata):
                lost_since = None
                kind = event.WhichOneof("kind")
                if kind == "snapshot":
                    job = event.snapshot
                    print(f"watching {job.id}: {state_name(job.state)}, step {job.progress.step}"
                          f" (snapshot at seq {event.seq}, after seq {after})", flush=True)
                    if after == 0:  # the stream goes on after the snapshot's seq
                        last_seq = event.seq
                    continue
                if kind == "heartbeat":
                    continue
                if event.seq != last_seq + 1:
                    print(f"warning: gap in the events: seq {last_seq} then {event.seq}", file=sys.stderr)
                last_seq = event.seq
                print_event(event)
            return  # the stream ends OK once the job has ended
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.OUT_OF_RANGE:
                print(f"events after seq {last_seq} are gone ({err.details()}); "
                      "starting again from a fresh snapshot", flush=True)
                last_seq = 0
                continue
            if err.code() != grpc.StatusCode.UNAVAILABLE:
                raise fail_rpc(f"watch {job_id}", err)
            if lost_since is None:
                lost_since = time.monotonic()
                print(f"stream lost ({err.details()}); reconnecting after seq {last_seq}", flush=True)
            elif time.monotonic() - lost_since > reconnect_seconds:
                raise fail_rpc(f"watch {job_id} (gave up reconnecting after {reconnect_seconds:g} s)", err)
            time.sleep(0.5)


def print_placement(p):
    print(f"memory placement of {p.job_id} at step {p.step}: {p.policy} policy on {p.device}, {p.phase}")
    print(f"  device capacity {p.device_capacity_bytes / 2**20:.1f} MiB, limit {p.device_limit_bytes / 2**20:.1f} MiB,"
          f" chunks of {p.chunk_size_bytes / 2**20:.2f} MiB, planned traffic {p.planned_traffic_bytes / 2**20:.2f} MiB/step")
    for t in p.totals:
        print(f"  {t.tier:<6} {t.kind:<10} {t.bytes / 2**20:10.2f} MiB")
    tiers = {}
    for c in p.chunks:
        tiers[c.tier] = tiers.get(c.tier, 0) + 1
    print("  chunk payloads by tier: " + ", ".join(f"{t} {n}" for t, n in sorted(tiers.items())))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("job_file", nargs="?", help="a YAML job file (flags below override it)")
    parser.add_argument("--address", default=os.environ.get("FERRY_ADDRESS", "127.0.0.1:50051"),
                        help="ferryd's address (default: $FERRY_ADDRESS or 127.0.0.1:50051)")
    parser.add_argument("--token", default=os.environ.get("FERRY_TOKEN", ""),
                        help="sent as 'authorization: Bearer TOKEN' (default: $FERRY_TOKEN)")
    parser.add_argument("--tls-ca", default=os.environ.get("FERRY_TLS_CA", ""),
                        help="talk TLS, trusting this CA (PEM) for ferryd's certificate "
                             "(default: $FERRY_TLS_CA; plaintext when no --tls-* is given)")
    parser.add_argument("--tls-cert", default=os.environ.get("FERRY_TLS_CERT", ""),
                        help="client certificate (PEM), for a ferryd that requires one (default: $FERRY_TLS_CERT)")
    parser.add_argument("--tls-key", default=os.environ.get("FERRY_TLS_KEY", ""),
                        help="the client certificate's key (default: $FERRY_TLS_KEY)")
    parser.add_argument("--name", help="the job's name (default: the job file's, or python-example)")
    parser.add_argument("--preset", help="model.preset, e.g. gpt2-tiny")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--steps", type=int, help="train.steps")
    parser.add_argument("--batch-size", type=int, help="train.batch_size")
    parser.add_argument("--data", help="a token file (data.path); default: synthetic data")
    parser.add_argument("--checkpoint-dir", help="checkpoint.dir")
    parser.add_argument("--reconnect-seconds", type=float, default=120,
                        help="how long to keep reconnecting a lost watch (default 120)")
    args = parser.parse_args()
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else []

    try:
        spec = build_spec(args)
        with open_channel(args) as channel:
            stub = ferry_pb2_grpc.FerryStub(channel)
            job = submit(stub, spec, metadata)
            print(f"submitted {job.id} to {args.address}", flush=True)
            watch(stub, job.id, metadata, args.reconnect_seconds)
            try:
                job = stub.GetJob(ferry_pb2.GetJobRequest(job_id=job.id), metadata=metadata, timeout=30)
            except grpc.RpcError as err:
                raise fail_rpc(f"get {job.id}", err)
            error = f": {job.error}" if job.error else ""
            print(f"{job.id} {state_name(job.state)} at step {job.progress.step}, "
                  f"loss {job.initial_loss:.4f} -> {job.progress.loss:.4f}{error}", flush=True)
            try:
                print_placement(stub.GetMemoryPlacement(
                    ferry_pb2.GetMemoryPlacementRequest(job_id=job.id), metadata=metadata, timeout=30))
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION:  # no step, no placement
                    raise fail_rpc(f"memory placement of {job.id}", err)
                print(f"no memory placement: {err.details()}")
    except Failure as e:
        print(f"ferry_client: {e}", file=sys.stderr)
        return e.code
    return 0 if job.state == job_pb2.JOB_STATE_SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
