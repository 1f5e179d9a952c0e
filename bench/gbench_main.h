// main() for the Google Benchmark suites in bench/, so they answer --help / -h the way the other
// bench binaries do: one line on what the suite measures, then Google Benchmark's own flags.
//
//   BRAID_BENCHMARK_MAIN("timeline_bench", "what one record call costs the recording thread");
//
// Without --help / -h it is BENCHMARK_MAIN(): Initialize, refuse unknown flags (exit 1), run.
#ifndef BRAID_BENCH_GBENCH_MAIN_H_
#define BRAID_BENCH_GBENCH_MAIN_H_

namespace braid::bench {

// Runs the registered benchmarks; with --help / -h prints `measures` and the flags, returns 0.
int RunGoogleBenchmarks(int argc, char** argv, const char* name, const char* measures);

}  // namespace braid::bench

#define BRAID_BENCHMARK_MAIN(name, measures)                                \
  int main(int argc, char** argv) {                                         \
    return ::braid::bench::RunGoogleBenchmarks(argc, argv, name, measures); \
  }

#endif  // BRAID_BENCH_GBENCH_MAIN_H_
