// The overlap benchmark's measurements and how they are reported (bench/overlap.cc): the
// times each rank records for a step, the statistics over iterations that turn them into one
// row per mode, and the printed report (tables, summaries, the CSV).
//
//   std::vector<Row> rows = SummarizeSteps(ranks, c.Modes(), times);   // times[mode][iter][rank]
//   PrintReport(c, model, report);   // --csv: only the CSV; else configuration, table, summary
//
// Definitions (see overlap.cc's header for the modes): a step's time is the slowest rank's,
// from the common start to its end; step_ms is the median over iterations, compute_ms the
// median of compute_only, comm_ms the median of comm_only, exposed_frac = (step_ms -
// compute_ms) / comm_ms. backward_ms is the median of the slowest rank's backward loop,
// tail_ms the median of (last rank's end of step - last rank's end of backward). The summary
// lines index rows by the position of each mode in Config::Modes(), so they assume its order.
#ifndef BRAID_BENCH_OVERLAP_REPORT_H_
#define BRAID_BENCH_OVERLAP_REPORT_H_

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "bench/overlap_config.h"
#include "bench/overlap_model.h"

namespace braid::bench {

using Clock = std::chrono::steady_clock;

// One rank's step, as steady_clock times: the common start (leaving the barrier), the end of
// its backward loop (compute, and the marks in overlapped mode), and the end of the step
// (FinishBackward returned).
struct StepTimes {
  Clock::time_point start, backward_end, end;
};

struct Row {
  int ranks = 0;
  StepMode mode = StepMode::kComputeOnly;
  double step_ms = 0, min_ms = 0, max_ms = 0, compute_ms = 0, comm_ms = 0, exposed = 0;
  double backward_ms = 0;  // median of the slowest rank's backward loop
  double tail_ms = 0;      // median of: last rank's step end - last rank's backward end
};

// One row per mode of `modes` (in that order) for `ranks` ranks, from every rank's times:
// times[mode][iteration][rank], timed iterations only. modes[0] must be compute_only and
// modes[1] comm_only (Config::Modes() starts so).
std::vector<Row> SummarizeSteps(int ranks, const std::vector<StepMode>& modes,
                                const std::vector<std::vector<std::vector<StepTimes>>>& times);

// Exactly: ranks,mode,step_ms,compute_ms,comm_ms,exposed_frac, then one line per row.
void PrintCsv(const std::vector<Row>& rows);

// What a whole run produced, for PrintReport.
struct RunReport {
  std::vector<Row> rows;           // every rank count's rows, in --ranks order
  std::vector<int> buckets;        // buckets per rank, one per rank count
  std::vector<std::string> notes;  // one per rank count: scheduler counters, autotuner trials
  bool mpi = false;                // --backend=mpi
  std::string mpi_engine;          // its BRAID_MPI_ENGINE
  std::vector<size_t> writes;      // per layer: the calibrated element writes of its compute
  double writes_per_us = 0;        // the calibration
  int floored = 0;                 // layers whose writes were floored at one full pass
};

// To stdout: under --csv only PrintCsv(rows); otherwise the configuration, the table of rows,
// a summary per rank count, the notes, then the CSV.
void PrintReport(const Config& c, const OverlapModel& model, const RunReport& report);

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_REPORT_H_
