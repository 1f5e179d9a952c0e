"""fuzz_target: one fuzz target (a file defining LLVMFuzzerTestOneInput), built two ways.

  <name>_test    cc_test in the default suite (any compiler): tests/fuzz/replay_main.cc replays
                 corpus/<name>/ and `runs` derived inputs.
  <name>_fuzzer  cc_binary for libFuzzer, tagged manual: build it with --config=fuzz (clang,
                 -fsanitize=fuzzer); tools/fuzz.sh does both and runs it.
"""

def fuzz_target(name, srcs, deps, runs = 3000, size = "small"):
    corpus = native.glob(["corpus/%s/*" % name])
    native.cc_test(
        name = name + "_test",
        size = size,
        srcs = srcs + ["replay_main.cc", "fuzz_util.h"],
        args = ["tests/fuzz/corpus/%s" % name, "--runs=%d" % runs],
        data = corpus,
        deps = deps,
    )
    native.cc_binary(
        name = name + "_fuzzer",
        testonly = 1,
        srcs = srcs + ["fuzz_util.h"],
        linkopts = ["-fsanitize=fuzzer"],
        linkstatic = 1,
        tags = ["manual"],
        deps = deps,
    )
