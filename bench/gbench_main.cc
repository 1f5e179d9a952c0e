#include "bench/gbench_main.h"

#include <cstdio>
#include <cstring>

#include "benchmark/benchmark.h"

namespace braid::bench {

int RunGoogleBenchmarks(int argc, char** argv, const char* name, const char* measures) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: tools/bazelw run //bench:%s -- [Google Benchmark flags]\n\n%s\n\n"
          "Common: --benchmark_filter=REGEX --benchmark_min_time=SECONDS\n"
          "        --benchmark_repetitions=N --benchmark_format=console|json|csv\n\n",
          name, measures);
      ::benchmark::PrintDefaultHelp();
      return 0;
    }
  }
  ::benchmark::Initialize(&argc, argv);
  if (::benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ::benchmark::RunSpecifiedBenchmarks();
  ::benchmark::Shutdown();
  return 0;
}

}  // namespace braid::bench
