"""A repository for LibTorch, found at $FERRY_LIBTORCH (default /usr).

/usr is Debian's libtorch-dev (CPU only). Any other prefix is an unpacked
LibTorch distribution (include/, lib/), for example a CUDA build from
pytorch.org; its CUDA library is linked when present.
"""

_HEADER_DIRS_UNDER_USR = ["torch", "ATen", "c10", "caffe2"]

def _libtorch_repository_impl(ctx):
    prefix = ctx.os.environ.get("FERRY_LIBTORCH", "/usr")
    include = ctx.path(prefix + "/include")
    if not include.exists:
        fail("FERRY_LIBTORCH=%s has no include/ directory; point it at a LibTorch install prefix" % prefix)
    if prefix == "/usr":
        children = [include.get_child(d) for d in _HEADER_DIRS_UNDER_USR]
        libdir = "/usr/lib/" + _multiarch(ctx)
    else:
        children = include.readdir()
        libdir = prefix + "/lib"
    for child in children:
        if child.exists:
            ctx.symlink(child, "include/" + child.basename)
    if not ctx.path(libdir + "/libtorch_cpu.so").exists:
        fail("no libtorch_cpu.so in %s; set FERRY_LIBTORCH to a LibTorch install prefix" % libdir)

    linkopts = ["-L" + libdir, "-Wl,-rpath," + libdir]
    cuda = ctx.path(libdir + "/libtorch_cuda.so").exists
    if cuda:
        # Nothing references torch_cuda's symbols directly: keep it linked so
        # its static initialisers register the CUDA backend.
        linkopts += ["-Wl,--no-as-needed", "-ltorch_cuda", "-Wl,--as-needed"]
    linkopts += ["-ltorch", "-ltorch_cpu", "-lc10"]
    if cuda:
        linkopts += ["-lc10_cuda"]

    ctx.file("BUILD.bazel", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"]),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = {defines},
    linkopts = {linkopts} + ["-lpthread"],
)

""".format(
        defines = repr(["FERRY_LIBTORCH_CUDA=1", "USE_C10D_NCCL"] if cuda else []),
        linkopts = repr(linkopts),
    ))

def _multiarch(ctx):
    result = ctx.execute(["gcc", "-print-multiarch"])
    arch = result.stdout.strip()
    return arch if arch else "x86_64-linux-gnu"

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["FERRY_LIBTORCH"],
    local = True,
)
