"""Python and Go stubs for .proto files, generated with the system protoc.

Like ferry_cc_proto_library, these run Debian's protoc and plugins in a
genrule (grpc_python_plugin from protobuf-compiler-grpc, protoc-gen-go and
protoc-gen-go-grpc from the packages of those names), so nothing is
downloaded. Each lays its files out as the language expects, under a
directory of its own in this package's output directory:

  ferry_py_proto_package: <root>/ferry/v1/ferry_pb2.py, .pyi, ferry_pb2_grpc.py
      and __init__.py files: put bazel-bin/<pkg>/<root> on PYTHONPATH.
  ferry_go_proto_tree: <root>/src/<go import path>/ferry.pb.go, ferry_grpc.pb.go:
      a GOPATH tree: put bazel-bin/<pkg>/<root> on GOPATH.
"""

_PROTOC = "/usr/bin/protoc -I{pkg} -I/usr/include"

def _base(src):
    return src[:-len(".proto")]

def _dirs(path):
    """Every directory above `path` ("a/b/c.proto" -> ["a", "a/b"])."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[:i + 1]) for i in range(len(parts))]

def ferry_py_proto_package(name, srcs, grpc_srcs = [], root = "python", visibility = None):
    """Python messages (*_pb2.py), type stubs (*_pb2.pyi) and gRPC stubs.

    The generated modules import each other as their proto paths say
    (`from ferry.v1 import job_pb2`), so `root` is the directory to put on
    PYTHONPATH; an __init__.py is generated in every directory below it.

    Args:
      name: the genrule (its outputs are the package's files).
      srcs: .proto files, relative to this package.
      grpc_srcs: the subset of srcs that declare services (*_pb2_grpc.py).
      root: the package root, relative to this package's output directory.
      visibility: of the genrule.
    """
    pkg = native.package_name()
    outs = []
    inits = {}
    for src in srcs:
        outs += [root + "/" + _base(src) + "_pb2.py", root + "/" + _base(src) + "_pb2.pyi"]
        for d in _dirs(src):
            inits[root + "/" + d + "/__init__.py"] = True
    for src in grpc_srcs:
        outs.append(root + "/" + _base(src) + "_pb2_grpc.py")
    out_dir = "$(RULEDIR)/" + root
    cmd = (_PROTOC + " --python_out={out} --pyi_out={out} {srcs}").format(
        pkg = pkg,
        out = out_dir,
        srcs = " ".join([pkg + "/" + s for s in srcs]),
    )
    if grpc_srcs:
        cmd += (" && " + _PROTOC + " --grpc_out={out} --plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin {srcs}").format(
            pkg = pkg,
            out = out_dir,
            srcs = " ".join([pkg + "/" + s for s in grpc_srcs]),
        )
    cmd += " && touch " + " ".join(["$(RULEDIR)/" + f for f in sorted(inits.keys())])
    native.genrule(
        name = name,
        srcs = srcs,
        outs = outs + sorted(inits.keys()),
        cmd = cmd,
        visibility = visibility,
    )

def ferry_go_proto_tree(name, srcs, importpath, grpc_srcs = [], root = "go", visibility = None):
    """Go messages (protoc-gen-go) and gRPC stubs (protoc-gen-go-grpc) in a GOPATH tree.

    Every file in srcs must say `option go_package = "<importpath>;<name>"`;
    the genrule fails naming the file that does not.

    Args:
      name: the genrule (its outputs are the package's .go files).
      srcs: .proto files, relative to this package.
      importpath: the Go import path of the generated package.
      grpc_srcs: the subset of srcs that declare services (*_grpc.pb.go).
      root: the GOPATH directory, relative to this package's output directory.
      visibility: of the genrule.
    """
    pkg = native.package_name()
    go_dir = root + "/src/" + importpath
    outs = []
    for src in srcs:
        outs.append(go_dir + "/" + _base(src).split("/")[-1] + ".pb.go")
    for src in grpc_srcs:
        outs.append(go_dir + "/" + _base(src).split("/")[-1] + "_grpc.pb.go")
    check = " && ".join([
        ("grep -q '^option go_package = \"{ip};' {f} || " +
         "{{ echo '{f}: needs option go_package = \"{ip};<package name>\";' >&2; exit 1; }}").format(
            ip = importpath,
            f = pkg + "/" + s,
        )
        for s in srcs
    ])
    cmd = check + (" && " + _PROTOC + " --go_out={out} --go-grpc_out={out}" +
                   " --plugin=protoc-gen-go=/usr/bin/protoc-gen-go" +
                   " --plugin=protoc-gen-go-grpc=/usr/bin/protoc-gen-go-grpc {srcs}").format(
        pkg = pkg,
        out = "$(RULEDIR)/" + root + "/src",
        srcs = " ".join([pkg + "/" + s for s in srcs]),
    )
    native.genrule(
        name = name,
        srcs = srcs,
        outs = outs,
        cmd = cmd,
        visibility = visibility,
    )
