// The main of a fuzz target built as an ordinary test (g++, no libFuzzer): replays every file
// of the seed corpus, then a few thousand inputs derived from them (random bytes, bit flips,
// truncations, splices), each through LLVMFuzzerTestOneInput. The same target linked with
// clang's -fsanitize=fuzzer (tools/fuzz.sh) searches for real; this keeps it honest in the
// default suite.
//
//   bazel-bin/tests/fuzz/state_file_fuzz_test tests/fuzz/corpus/state_file [--runs=N] [--seed=S]
//
// A crash or a failed check inside the target aborts, as under libFuzzer; the input that did
// it is written to $TEST_UNDECLARED_OUTPUTS_DIR (or the working directory) as crash-<n>.
#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

std::vector<Bytes> ReadCorpus(const std::string& dir) {
  std::vector<Bytes> corpus;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    std::fprintf(stderr, "replay: cannot open corpus directory %s\n", dir.c_str());
    std::exit(2);
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    std::ifstream in(dir + "/" + n, std::ios::binary);
    corpus.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return corpus;
}

// Remembers the input under test, so a crash can be reproduced from the file it leaves.
void SaveInput(const Bytes& input, int n) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string path =
      std::string(dir != nullptr ? dir : ".") + "/last-input-" + std::to_string(n);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(input.data()),
             static_cast<std::streamsize>(input.size()));
}

Bytes Mutate(const std::vector<Bytes>& corpus, std::mt19937_64& rng) {
  Bytes out = corpus.empty() ? Bytes{} : corpus[rng() % corpus.size()];
  const int edits = 1 + static_cast<int>(rng() % 8);
  for (int e = 0; e < edits; ++e) {
    switch (rng() % 6) {
      case 0:  // flip a bit
        if (!out.empty()) out[rng() % out.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:  // random byte
        if (!out.empty()) out[rng() % out.size()] = static_cast<uint8_t>(rng());
        break;
      case 2:  // truncate
        if (!out.empty()) out.resize(rng() % out.size());
        break;
      case 3:  // insert random bytes
        for (int k = static_cast<int>(rng() % 16); k > 0; --k) {
          out.insert(out.begin() + static_cast<long>(out.empty() ? 0 : rng() % (out.size() + 1)),
                     static_cast<uint8_t>(rng()));
        }
        break;
      case 4:  // splice the tail of another input
        if (!corpus.empty()) {
          const Bytes& other = corpus[rng() % corpus.size()];
          const size_t keep = out.empty() ? 0 : rng() % out.size();
          const size_t from = other.empty() ? 0 : rng() % other.size();
          out.resize(keep);
          out.insert(out.end(), other.begin() + static_cast<long>(from), other.end());
        }
        break;
      default:  // an interesting value over 4 bytes
        if (out.size() >= 4) {
          static const uint32_t kValues[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 64, 4096};
          const uint32_t v = kValues[rng() % (sizeof(kValues) / sizeof(kValues[0]))];
          std::memcpy(&out[rng() % (out.size() - 3)], &v, 4);
        }
        break;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  long runs = 3000;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--runs=", 7) == 0) {
      runs = std::strtol(argv[i] + 7, nullptr, 10);
    } else if (std::strncmp(argv[i], "--seed=", 7) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else {
      dir = argv[i];
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [--runs=N] [--seed=S]\n", argv[0]);
    return 2;
  }
  const std::vector<Bytes> corpus = ReadCorpus(dir);
  std::printf("replay: %zu seed inputs from %s, then %ld derived inputs (seed %llu)\n",
              corpus.size(), dir.c_str(), runs, static_cast<unsigned long long>(seed));
  for (const Bytes& input : corpus) LLVMFuzzerTestOneInput(input.data(), input.size());
  std::mt19937_64 rng(seed);
  for (long r = 0; r < runs; ++r) {
    Bytes input;
    if (r % 8 == 7) {  // now and then, pure noise
      input.resize(rng() % 512);
      for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
    } else {
      input = Mutate(corpus, rng);
    }
    if (std::getenv("FUZZ_REPLAY_SAVE") != nullptr) SaveInput(input, 0);
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("replay: done, %zu + %ld inputs\n", corpus.size(), runs);
  return 0;
}
