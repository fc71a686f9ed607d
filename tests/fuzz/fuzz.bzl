"""ferry_fuzzer: a libFuzzer target and a test that replays its seed corpus."""

def ferry_fuzzer(name, srcs, deps, corpus):
    """Declares `name` (the fuzzer) and `name_corpus_test`.

    Built with --config=fuzz, `name` is a libFuzzer binary (clang,
    -fsanitize=fuzzer,address,undefined); in any other build it replays the
    files and directories named on its command line, so the seed corpus and
    every input that once crashed it run in the ordinary `bazel test`.

    Args:
      name: the fuzzer's name.
      srcs: sources defining LLVMFuzzerTestOneInput.
      deps: what they use.
      corpus: the seed corpus directory, e.g. "corpus/job_spec_yaml_fuzzer".
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + ["//tests/fuzz:fuzz_main"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        srcs = srcs,
        # -runs=0: a libFuzzer build runs the corpus once and stops; the
        # replay main ignores flags.
        args = ["-runs=0", "tests/fuzz/" + corpus],
        data = native.glob([corpus + "/**"]),
        deps = deps + ["//tests/fuzz:fuzz_main"],
    )
