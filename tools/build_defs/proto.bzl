"""C++ code generation for .proto files with the system protoc.

Bazel 4's own proto rules would download protobuf; this macro runs Debian's
protoc (and grpc_cpp_plugin for services) in a genrule instead.
"""

def ferry_cc_proto_library(name, srcs, deps = [], grpc_srcs = [], visibility = None):
    """Generates and compiles C++ for `srcs` (paths relative to this package).

    Import paths are relative to this package's directory, so a file
    `ferry/v1/job.proto` here is imported as "ferry/v1/job.proto" and its header
    is included as "ferry/v1/job.pb.h".

    Args:
      name: the cc_library to create.
      srcs: .proto files to generate messages for.
      deps: ferry_cc_proto_library targets whose protos these import.
      grpc_srcs: the subset of srcs that declare services.
      visibility: of the cc_library.
    """
    pkg = native.package_name()
    hdrs = []
    ccs = []
    for src in srcs:
        base = src[:-len(".proto")]
        hdrs.append(base + ".pb.h")
        ccs.append(base + ".pb.cc")
    for src in grpc_srcs:
        base = src[:-len(".proto")]
        hdrs.append(base + ".grpc.pb.h")
        ccs.append(base + ".grpc.pb.cc")

    grpc_cmd = ""
    if grpc_srcs:
        grpc_cmd = " && /usr/bin/protoc -I{pkg} -I/usr/include --grpc_out=$(GENDIR)/{pkg} --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin {grpc}".format(
            pkg = pkg,
            grpc = " ".join([pkg + "/" + s for s in grpc_srcs]),
        )

    native.genrule(
        name = name + "_gen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = hdrs + ccs,
        cmd = "/usr/bin/protoc -I{pkg} -I/usr/include --cpp_out=$(GENDIR)/{pkg} {srcs}".format(
            pkg = pkg,
            srcs = " ".join([pkg + "/" + s for s in srcs]),
        ) + grpc_cmd,
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + [d + "_srcs" for d in deps],
        visibility = visibility,
    )
    native.cc_library(
        name = name,
        srcs = ccs,
        hdrs = hdrs,
        includes = ["."],
        deps = deps + ["@ferry//third_party:grpc" if grpc_srcs else "@ferry//third_party:protobuf"],
        visibility = visibility,
    )
