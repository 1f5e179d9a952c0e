// Timeline: the written file is valid Chrome-trace JSON (parsed here by a small strict parser)
// with the expected events, rows, args and timestamps; concurrent recorders lose nothing when the
// queue is large enough; a full queue drops and counts, and a stalled writer never blocks the
// recording thread; disabled means no file; bad paths and I/O errors are errors naming the file.
#include "scheduler/timeline.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/timeline_queue.h"

namespace braid::sched {
namespace {

// ---- A minimal strict JSON parser (objects, arrays, strings, numbers, true/false/null) ----

struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  bool b = false;
  double number = 0;
  std::string str;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* Find(const std::string& key) const {
    for (const auto& [k, v] : members) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  const Json& operator[](const std::string& key) const {
    static const Json kMissing;
    const Json* v = Find(key);
    return v == nullptr ? kMissing : *v;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  // Parses the whole text; false (with error()) on any syntax error or trailing garbage.
  bool Parse(Json* out) {
    if (!Value(out)) return false;
    SkipSpace();
    return pos_ == s_.size() || Fail("trailing characters");
  }
  const std::string& error() const { return error_; }

 private:
  bool Fail(const std::string& what) {
    error_ = absl::StrCat(what, " at offset ", pos_, ": '", s_.substr(pos_, 40), "'");
    return false;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Literal(const char* word) {
    const std::string w(word);
    if (s_.compare(pos_, w.size(), w) != 0) return Fail("bad literal");
    pos_ += w.size();
    return true;
  }
  bool Value(Json* out) {
    SkipSpace();
    if (pos_ >= s_.size()) return Fail("unexpected end");
    const char c = s_[pos_];
    if (c == '{') return Object(out);
    if (c == '[') return Array(out);
    if (c == '"') {
      out->kind = Json::kString;
      return String(&out->str);
    }
    if (c == 't' || c == 'f') {
      out->kind = Json::kBool;
      out->b = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') return Literal("null");
    return Number(out);
  }
  bool Number(Json* out) {
    const size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    const size_t digits = pos_;
    while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (pos_ == digits) return Fail("bad number");
    if (s_[digits] == '0' && pos_ - digits > 1) return Fail("leading zero");
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      const size_t frac = pos_;
      while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ == frac) return Fail("bad fraction");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      const size_t exp = pos_;
      while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      if (pos_ == exp) return Fail("bad exponent");
    }
    out->kind = Json::kNumber;
    out->number = std::strtod(s_.substr(start, pos_ - start).c_str(), nullptr);
    return true;
  }
  bool String(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < s_.size()) {
      const char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("raw control character in string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= s_.size()) break;
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          if (pos_ + 4 > s_.size()) return Fail("short \\u escape");
          const long code = std::strtol(s_.substr(pos_, 4).c_str(), nullptr, 16);
          if (code >= 0x80) return Fail("non-ASCII \\u escape (not produced by Timeline)");
          out->push_back(static_cast<char>(code));
          pos_ += 4;
          break;
        }
        default:
          return Fail("bad escape");
      }
    }
    return Fail("unterminated string");
  }
  bool Array(Json* out) {
    out->kind = Json::kArray;
    ++pos_;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
    for (;;) {
      out->items.emplace_back();
      if (!Value(&out->items.back())) return false;
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') return ++pos_, true;
      return Fail("expected , or ]");
    }
  }
  bool Object(Json* out) {
    out->kind = Json::kObject;
    ++pos_;
    SkipSpace();
    if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
    for (;;) {
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected key");
      std::string key;
      if (!String(&key)) return false;
      if (out->Find(key) != nullptr) return Fail("duplicate key " + key);
      SkipSpace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected :");
      ++pos_;
      Json value;
      if (!Value(&value)) return false;
      out->members.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') return ++pos_, true;
      return Fail("expected , or }");
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
  std::string error_;
};

// ---- Helpers ----

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh empty directory under the test's temporary directory.
std::string FreshDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = absl::StrCat(::testing::TempDir(), "/timeline_", info->name());
  EXPECT_EQ(std::system(absl::StrCat("rm -rf '", dir, "'").c_str()), 0);
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  return dir;
}

// A parsed trace, checked for the shape every Timeline file must have: a top-level object with a
// "traceEvents" array whose events are X / i / M with the right fields, valid timestamps, pid
// rank+1, and an "otherData" with the counts.
struct Trace {
  Json root;
  std::vector<const Json*> events;          // X and i, in file order
  std::map<int, std::string> thread_names;  // tid -> row name
  std::string process_name;

  const Json& other() const { return root["otherData"]; }
  int Count(const std::string& ph) const {
    int n = 0;
    for (const Json* e : events) n += (*e)["ph"].str == ph;
    return n;
  }
};

void ParseTrace(const std::string& text, int rank, Trace* trace) {
  JsonParser parser(text);
  ASSERT_TRUE(parser.Parse(&trace->root)) << parser.error();
  ASSERT_EQ(trace->root.kind, Json::kObject);
  const Json& list = trace->root["traceEvents"];
  ASSERT_EQ(list.kind, Json::kArray);
  EXPECT_EQ(trace->root["displayTimeUnit"].str, "ms");
  EXPECT_EQ(trace->other()["braid_rank"].number, rank);
  for (const Json& e : list.items) {
    ASSERT_EQ(e.kind, Json::kObject);
    ASSERT_EQ(e["name"].kind, Json::kString);
    ASSERT_EQ(e["ph"].kind, Json::kString);
    EXPECT_EQ(e["pid"].number, rank + 1) << "pid is rank + 1 (Perfetto treats pid 0 specially)";
    const std::string& ph = e["ph"].str;
    if (ph == "M") {
      if (e["name"].str == "thread_name") {
        const int tid = static_cast<int>(e["tid"].number);
        EXPECT_GE(tid, 1);
        EXPECT_EQ(trace->thread_names.count(tid), 0u) << "one name per row";
        trace->thread_names[tid] = e["args"]["name"].str;
      } else if (e["name"].str == "process_name") {
        trace->process_name = e["args"]["name"].str;
      } else {
        EXPECT_TRUE(e["name"].str == "thread_sort_index" || e["name"].str == "process_sort_index")
            << e["name"].str;
      }
      continue;
    }
    ASSERT_TRUE(ph == "X" || ph == "i") << ph;
    ASSERT_EQ(e["ts"].kind, Json::kNumber);
    EXPECT_GE(e["ts"].number, 0.0);
    EXPECT_GE(e["tid"].number, 1);
    if (ph == "X") {
      ASSERT_EQ(e["dur"].kind, Json::kNumber);
      EXPECT_GE(e["dur"].number, 0.0);
    } else {
      EXPECT_EQ(e["s"].str, "t");
      EXPECT_EQ(e.Find("dur"), nullptr);
    }
    if (const Json* args = e.Find("args")) {
      ASSERT_EQ((*args)["v"].kind, Json::kNumber);
      EXPECT_GE((*args)["v"].number, 0);
    }
    trace->events.push_back(&e);
  }
  EXPECT_EQ(trace->other()["events_written"].number, trace->events.size());
}

// ---- Tests ----

TEST(TimelineTest, WritesChromeTraceWithEventsRowsAndArgs) {
  const std::string prefix = FreshDir() + "/run";
  const int64_t before_create = Timeline::NowNs();
  auto created = Timeline::Create(prefix, 2);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& tl = **created;
  ASSERT_TRUE(tl.enabled());
  EXPECT_EQ(tl.path(), prefix + ".rank2.json");

  const int marks = tl.Track("marks");
  const int launches = tl.Track("bucket launches");
  const int world = tl.Track("group world");
  const int shard = tl.Track("group shard");
  const int waits = tl.Track("waits");
  EXPECT_EQ(tl.Track("group world"), world) << "same name, same row";
  EXPECT_EQ(marks, 0);
  EXPECT_EQ(waits, 4);

  for (int p = 0; p < 3; ++p) tl.Instant(marks, "mark", p);
  tl.Instant(launches, "launch", 0);
  const int64_t t0 = Timeline::NowNs();
  const int64_t t1 = t0 + 12345678;  // 12345.678 us
  tl.Complete(world, "allreduce", t0, t1, 0);
  tl.Complete(shard, "reduce_scatter", t0 + 1000, t0 + 3000);  // no arg
  tl.Complete(shard, "backwards", t0 + 5000, t0 + 4000, 9);    // negative: written as 0
  {
    TimelineSpan span(tl, waits, "wait", 1);
    span.set_arg(5);
  }
  tl.Instant(marks, "escape \"quoted\" \\ and\nnewline");
  const int64_t after_records = Timeline::NowNs();
  ASSERT_TRUE(tl.Close().ok());
  EXPECT_TRUE(tl.Close().ok()) << "idempotent";
  EXPECT_EQ(tl.dropped(), 0u);
  EXPECT_EQ(tl.written(), 9u);

  Trace trace;
  ASSERT_NO_FATAL_FAILURE(ParseTrace(ReadFile(prefix + ".rank2.json"), 2, &trace));
  EXPECT_EQ(trace.process_name, "rank 2");
  EXPECT_EQ(trace.thread_names, (std::map<int, std::string>{{marks + 1, "marks"},
                                                            {launches + 1, "bucket launches"},
                                                            {world + 1, "group world"},
                                                            {shard + 1, "group shard"},
                                                            {waits + 1, "waits"}}));
  ASSERT_EQ(trace.events.size(), 9u);
  EXPECT_EQ(trace.Count("X"), 4);
  EXPECT_EQ(trace.Count("i"), 5);
  EXPECT_EQ(trace.other()["events_dropped"].number, 0);

  // One recording thread: file order is record order.
  const std::vector<std::string> names = {
      "mark",      "mark",      "mark",
      "launch",    "allreduce", "reduce_scatter",
      "backwards", "wait",      "escape \"quoted\" \\ and\nnewline"};
  const std::vector<int> tids = {marks, marks, marks, launches, world, shard, shard, waits, marks};
  const std::vector<int64_t> args = {0, 1, 2, 0, 0, -1, 9, 5, -1};
  const double max_ts_us = (after_records - before_create) / 1000.0;
  for (size_t i = 0; i < names.size(); ++i) {
    const Json& e = *trace.events[i];
    SCOPED_TRACE(absl::StrCat("event ", i, " ", names[i]));
    EXPECT_EQ(e["name"].str, names[i]);
    EXPECT_EQ(e["tid"].number, tids[i] + 1);
    if (args[i] >= 0) {
      EXPECT_EQ(e["args"]["v"].number, args[i]);
    } else {
      EXPECT_EQ(e.Find("args"), nullptr);
    }
    EXPECT_LE(e["ts"].number, max_ts_us) << "relative to creation";
  }
  // Instants on one thread: monotone. Spans: exact durations, starts consistent with t0.
  EXPECT_LE((*trace.events[0])["ts"].number, (*trace.events[1])["ts"].number);
  EXPECT_LE((*trace.events[1])["ts"].number, (*trace.events[2])["ts"].number);
  EXPECT_LE((*trace.events[2])["ts"].number, (*trace.events[3])["ts"].number);
  EXPECT_LE((*trace.events[3])["ts"].number, (*trace.events[4])["ts"].number);
  EXPECT_DOUBLE_EQ((*trace.events[4])["dur"].number, 12345.678);
  EXPECT_DOUBLE_EQ((*trace.events[5])["dur"].number, 2.0);
  EXPECT_NEAR((*trace.events[5])["ts"].number - (*trace.events[4])["ts"].number, 1.0, 1e-9);
  EXPECT_EQ((*trace.events[6])["dur"].number, 0.0);
  EXPECT_GE((*trace.events[7])["ts"].number, (*trace.events[4])["ts"].number);
}

TEST(TimelineTest, TimestampsBeforeCreationArePinnedAtZero) {
  const std::string prefix = FreshDir() + "/early";
  const int64_t early = Timeline::NowNs();
  auto tl = Timeline::Create(prefix, 0);
  ASSERT_TRUE(tl.ok()) << tl.status();
  const int row = (*tl)->Track("waits");
  (*tl)->Complete(row, "before", early - 5000, Timeline::NowNs());
  (*tl)->InstantAt(row, "long ago", early - 1000000);
  ASSERT_TRUE((*tl)->Close().ok());
  Trace trace;
  ASSERT_NO_FATAL_FAILURE(ParseTrace(ReadFile(prefix + ".rank0.json"), 0, &trace));
  ASSERT_EQ(trace.events.size(), 2u);
  EXPECT_EQ((*trace.events[0])["ts"].number, 0.0);
  EXPECT_GT((*trace.events[0])["dur"].number, 5.0);
  EXPECT_EQ((*trace.events[1])["ts"].number, 0.0);
}

TEST(TimelineTest, ConcurrentRecordersLoseNothingWithALargeQueue) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  const std::string prefix = FreshDir() + "/mt";
  TimelineOptions options;
  options.queue_capacity = kThreads * kPerThread;  // never full, however slow the writer
  auto created = Timeline::Create(prefix, 1, options);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& tl = **created;
  std::vector<int> rows;
  for (int t = 0; t < kThreads; ++t) rows.push_back(tl.Track(absl::StrCat("thread ", t)));

  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) {
      }
      for (int i = 0; i < kPerThread; ++i) {
        if (i % 2 == 0) {
          tl.Instant(rows[t], "mark", i);
        } else {
          const int64_t start = Timeline::NowNs();
          tl.Complete(rows[t], "span", start, Timeline::NowNs(), i);
        }
      }
    });
  }
  go.store(true, std::memory_order_release);
  for (std::thread& th : threads) th.join();
  ASSERT_TRUE(tl.Close().ok());
  EXPECT_EQ(tl.dropped(), 0u);
  EXPECT_EQ(tl.written(), uint64_t{kThreads} * kPerThread);

  Trace trace;
  ASSERT_NO_FATAL_FAILURE(ParseTrace(ReadFile(prefix + ".rank1.json"), 1, &trace));
  ASSERT_EQ(trace.events.size(), size_t{kThreads} * kPerThread);
  EXPECT_EQ(trace.Count("i"), kThreads * kPerThread / 2);
  EXPECT_EQ(trace.Count("X"), kThreads * kPerThread / 2);
  EXPECT_EQ(trace.other()["events_dropped"].number, 0);
  // Per recording thread (= row): every index once, in record order, timestamps monotone.
  std::map<int, int> next_arg;
  std::map<int, double> last_ts;
  for (const Json* e : trace.events) {
    const int tid = static_cast<int>((*e)["tid"].number);
    ASSERT_TRUE(tid >= 1 && tid <= kThreads) << tid;
    EXPECT_EQ((*e)["args"]["v"].number, next_arg[tid]) << "row " << tid;
    EXPECT_EQ((*e)["name"].str, next_arg[tid] % 2 == 0 ? "mark" : "span");
    ++next_arg[tid];
    EXPECT_GE((*e)["ts"].number, last_ts[tid]);
    last_ts[tid] = (*e)["ts"].number;
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(next_arg[rows[t] + 1], kPerThread);
  EXPECT_EQ(trace.thread_names.size(), size_t{kThreads});
}

TEST(TimelineTest, TinyQueueDropsAndCounts) {
  constexpr int kEvents = 100000;
  const std::string prefix = FreshDir() + "/tiny";
  TimelineOptions options;
  options.queue_capacity = 4;
  options.flush_interval = absl::Seconds(30);  // the writer drains only at Close()
  auto created = Timeline::Create(prefix, 0, options);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& tl = **created;
  const int row = tl.Track("marks");
  for (int i = 0; i < kEvents; ++i) tl.Instant(row, "mark", i);
  const uint64_t dropped = tl.dropped();
  EXPECT_GT(dropped, 0u);
  ASSERT_TRUE(tl.Close().ok());
  EXPECT_EQ(tl.dropped(), dropped);
  EXPECT_EQ(tl.written() + tl.dropped(), uint64_t{kEvents}) << "every record written or counted";

  Trace trace;
  ASSERT_NO_FATAL_FAILURE(ParseTrace(ReadFile(prefix + ".rank0.json"), 0, &trace));
  EXPECT_EQ(trace.events.size(), tl.written());
  EXPECT_EQ(trace.other()["events_dropped"].number, dropped);
  EXPECT_EQ(trace.other()["queue_capacity"].number, 4);
  // What survived is in order.
  double last = -1;
  for (const Json* e : trace.events) {
    EXPECT_GT((*e)["args"]["v"].number, last);
    last = (*e)["args"]["v"].number;
  }
}

// The writer is stuck in write() on a pipe nobody reads: recording must neither block nor lose
// count, and once the pipe is drained Close() completes with a valid file.
TEST(TimelineTest, StalledWriterNeverBlocksRecording) {
  constexpr int kEvents = 200000;
  const std::string prefix = FreshDir() + "/stall";
  const std::string path = prefix + ".rank0.json";
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << path;
  // A reader must exist for the writer's open to succeed; it reads nothing until the end.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  TimelineOptions options;
  options.queue_capacity = 64;
  options.flush_interval = absl::Microseconds(100);
  auto created = Timeline::Create(prefix, 0, options);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& tl = **created;
  const int row = tl.Track("group world");
  // Fill the pipe (64 KiB, ~800 events) so the writer blocks in write().
  for (int i = 0; i < 4000; ++i) {
    tl.Complete(row, "allreduce", Timeline::NowNs(), Timeline::NowNs(), i);
    if (i % 32 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (int i = 4000; i < kEvents; ++i) {
    tl.Complete(row, "allreduce", Timeline::NowNs(), Timeline::NowNs(), i);
  }
  EXPECT_GT(tl.dropped(), uint64_t{kEvents} / 2) << "the stalled writer cannot have taken most";

  ASSERT_EQ(fcntl(fd, F_SETFL, 0), 0);  // blocking reads from here on
  std::string text;
  std::thread reader([&] {
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
  });
  const absl::Status closed = tl.Close();
  reader.join();
  close(fd);
  ASSERT_TRUE(closed.ok()) << closed;
  EXPECT_EQ(tl.written() + tl.dropped(), uint64_t{kEvents});
  Trace trace;
  ASSERT_NO_FATAL_FAILURE(ParseTrace(text, 0, &trace));
  EXPECT_EQ(trace.events.size(), tl.written());
  EXPECT_EQ(trace.other()["events_dropped"].number, tl.dropped());
}

TEST(TimelineTest, FlushPutsRecordedEventsInTheFile) {
  const std::string prefix = FreshDir() + "/flush";
  TimelineOptions options;
  options.flush_interval = absl::Seconds(30);
  auto created = Timeline::Create(prefix, 0, options);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& tl = **created;
  const int row = tl.Track("marks");
  tl.Instant(row, "first mark", 11);
  ASSERT_TRUE(tl.Flush().ok());
  EXPECT_NE(ReadFile(tl.path()).find("\"first mark\""), std::string::npos);
  EXPECT_EQ(tl.written(), 1u);
  ASSERT_TRUE(tl.Close().ok());
  EXPECT_TRUE(tl.Flush().ok()) << "after Close: returns at once";
}

TEST(TimelineTest, DisabledWritesNoFileAndRecordsNothing) {
  const std::string dir = FreshDir();
  auto created = Timeline::Create("", 0);
  ASSERT_TRUE(created.ok()) << created.status();
  Timeline& tl = **created;
  EXPECT_FALSE(tl.enabled());
  EXPECT_EQ(tl.path(), "");
  EXPECT_EQ(tl.Track("marks"), 0);
  tl.Instant(0, "mark", 1);
  tl.Complete(0, "span", 1, 2, 3);
  { TimelineSpan span(tl, 0, "wait"); }
  EXPECT_TRUE(tl.Flush().ok());
  EXPECT_TRUE(tl.Close().ok());
  EXPECT_TRUE(tl.Close().ok());
  EXPECT_EQ(tl.dropped(), 0u);
  EXPECT_EQ(tl.written(), 0u);

  // BRAID_TIMELINE unset: disabled; set: enabled, writing <prefix>.rank<r>.json.
  Options opts;
  auto off = Timeline::FromOptions(opts, 3);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE((*off)->enabled());
  EXPECT_EQ(std::system(absl::StrCat("test -z \"$(ls -A '", dir, "')\"").c_str()), 0)
      << "a disabled timeline creates no file";

  opts.timeline = dir + "/env";
  auto on = Timeline::FromOptions(opts, 3);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE((*on)->enabled());
  EXPECT_EQ((*on)->path(), dir + "/env.rank3.json");
  on->reset();  // the destructor closes
  Trace trace;
  ASSERT_NO_FATAL_FAILURE(ParseTrace(ReadFile(dir + "/env.rank3.json"), 3, &trace));
  EXPECT_TRUE(trace.events.empty());
}

TEST(TimelineTest, UnwritablePathIsAnErrorNamingIt) {
  const std::string prefix = FreshDir() + "/no/such/dir/trace";
  auto created = Timeline::Create(prefix, 5);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kNotFound) << created.status();
  EXPECT_NE(created.status().message().find(prefix + ".rank5.json"), std::string::npos)
      << created.status();
}

TEST(TimelineTest, WriteErrorIsReportedByCloseNamingTheFile) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  const std::string prefix = FreshDir() + "/full";
  const std::string path = prefix + ".rank0.json";
  ASSERT_EQ(symlink("/dev/full", path.c_str()), 0);
  auto created = Timeline::Create(prefix, 0);
  ASSERT_TRUE(created.ok()) << created.status();  // the header sits in stdio's buffer
  Timeline& tl = **created;
  const int row = tl.Track("marks");
  for (int i = 0; i < 100; ++i) tl.Instant(row, "mark", i);
  const absl::Status status = tl.Close();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;  // ENOSPC
  EXPECT_NE(status.message().find(path), std::string::npos) << status;
  EXPECT_EQ(tl.Close(), status) << "idempotent: the same result";
}

TEST(TimelineTest, RejectsBadArguments) {
  const std::string prefix = FreshDir() + "/bad";
  EXPECT_EQ(Timeline::Create(prefix, -1).status().code(), absl::StatusCode::kInvalidArgument);
  TimelineOptions zero_queue;
  zero_queue.queue_capacity = 0;
  EXPECT_EQ(Timeline::Create(prefix, 0, zero_queue).status().code(),
            absl::StatusCode::kInvalidArgument);
  TimelineOptions zero_interval;
  zero_interval.flush_interval = absl::ZeroDuration();
  EXPECT_EQ(Timeline::Create(prefix, 0, zero_interval).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TimelineQueueTest, BoundedFifoThatReportsFull) {
  TimelineQueue<int> q(3);
  EXPECT_EQ(q.capacity(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(q.TryPush(i));
  EXPECT_FALSE(q.TryPush(99)) << "full";
  int v = -1;
  for (int lap = 0; lap < 3; ++lap) {  // wrap around the ring a few times
    ASSERT_TRUE(q.TryPop(&v));
    EXPECT_EQ(v, lap);
    EXPECT_TRUE(q.TryPush(4 + lap));
    EXPECT_FALSE(q.TryPush(99));
  }
  for (int expect = 3; expect < 7; ++expect) {
    ASSERT_TRUE(q.TryPop(&v));
    EXPECT_EQ(v, expect);
  }
  EXPECT_FALSE(q.TryPop(&v)) << "empty";
  EXPECT_EQ(q.pushed(), 7u);
  EXPECT_EQ(q.popped(), 7u);
}

}  // namespace
}  // namespace braid::sched
