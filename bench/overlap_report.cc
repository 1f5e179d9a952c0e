// The overlap benchmark's statistics and report; see overlap_report.h.
#include "bench/overlap_report.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace braid::bench {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 == 1 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

}  // namespace

std::vector<Row> SummarizeSteps(int ranks, const std::vector<StepMode>& modes,
                                const std::vector<std::vector<std::vector<StepTimes>>>& times) {
  const int num_modes = static_cast<int>(modes.size());
  std::vector<Row> rows;
  // Per iteration the slowest rank's time; then statistics over iterations.
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::vector<std::vector<double>> step(num_modes), backward(num_modes), tail(num_modes);
  for (int m = 0; m < num_modes; ++m) {
    for (size_t it = 0; it < times[m].size(); ++it) {
      double s = 0, b = 0;
      Clock::time_point last_backward_end = Clock::time_point::min(), last_end = last_backward_end;
      for (const StepTimes& t : times[m][it]) {
        s = std::max(s, ms(t.end - t.start));
        b = std::max(b, ms(t.backward_end - t.start));
        last_backward_end = std::max(last_backward_end, t.backward_end);
        last_end = std::max(last_end, t.end);
      }
      step[m].push_back(s);
      backward[m].push_back(b);
      tail[m].push_back(ms(last_end - last_backward_end));
    }
  }
  const double compute_ms = Median(step[0]);
  const double comm_ms = Median(step[1]);
  for (int m = 0; m < num_modes; ++m) {
    Row row;
    row.ranks = ranks;
    row.mode = modes[m];
    row.step_ms = Median(step[m]);
    row.min_ms = *std::min_element(step[m].begin(), step[m].end());
    row.max_ms = *std::max_element(step[m].begin(), step[m].end());
    row.compute_ms = compute_ms;
    row.comm_ms = comm_ms;
    row.exposed = (row.step_ms - compute_ms) / comm_ms;
    row.backward_ms = Median(backward[m]);
    row.tail_ms = Median(tail[m]);
    rows.push_back(row);
  }
  return rows;
}

void PrintCsv(const std::vector<Row>& rows) {
  std::printf("ranks,mode,step_ms,compute_ms,comm_ms,exposed_frac\n");
  for (const Row& r : rows) {
    std::printf("%d,%s,%.3f,%.3f,%.3f,%.4f\n", r.ranks, ModeName(r.mode), r.step_ms, r.compute_ms,
                r.comm_ms, r.exposed);
  }
}

void PrintReport(const Config& c, const OverlapModel& model, const RunReport& report) {
  const std::vector<Row>& rows = report.rows;
  const std::vector<int>& buckets = report.buckets;
  const std::vector<std::string>& notes = report.notes;
  const bool mpi = report.mpi;
  const std::string& mpi_engine = report.mpi_engine;
  const std::vector<size_t>& writes = report.writes;
  const double writes_per_us = report.writes_per_us;
  const int floored = report.floored;
  if (c.csv) {
    PrintCsv(rows);
    return;
  }
  const double mib = model.elems() * 4.0 / (1 << 20);
  std::printf(
      "# Braid overlap: GPT-2-small shapes x %.3g (%d blocks): %zu params in %zu layers, %.1f MiB "
      "of f32 "
      "gradients per rank\n",
      c.scale, c.blocks, model.params.size(), model.layers.size(), mib);
  if (mpi) {
    std::printf("# backend mpi: one process per rank under mpirun, BRAID_MPI_ENGINE=%s\n",
                mpi_engine.c_str());
  }
  std::printf("# reduce mode %s, bucket caps %lld / %lld B (first), buckets per rank:",
              c.fully_sharded ? "fully_sharded (reduce_scatter, ZeRO-3 units, prefetch 1)"
                              : ReduceName(c.reduce),
              static_cast<long long>(c.bucket_cap), static_cast<long long>(c.first_bucket_cap));
  for (size_t i = 0; i < c.ranks.size(); ++i) std::printf(" %d (%d ranks)", buckets[i], c.ranks[i]);
  if (c.sleep_compute) {
    std::printf(
        "\n# compute: sleep: one pass writing the layer's gradients, then sleep to %lld us per "
        "layer\n",
        static_cast<long long>(c.layer_compute_us));
  } else {
    std::printf(
        "\n# compute: busy: %lld us per layer on one idle core = %zu element writes (%.0f "
        "writes/us "
        "calibrated)%s\n",
        static_cast<long long>(c.layer_compute_us), writes[1], writes_per_us,
        floored > 0 ? absl::StrCat("; ", floored, " layer(s) floored at one full pass").c_str()
                    : "");
  }
  std::printf("# embeddings (ready last): %.1f MiB = %.0f%% of the gradient bytes\n",
              model.layers[0].elems * 4.0 / (1 << 20),
              100.0 * model.layers[0].elems / model.elems());
  std::printf(
      "# step = slowest rank, median of %d iterations after %d warm-up, modes interleaved; "
      "results checked exactly: 0 wrong\n#\n",
      c.iters, c.warmup);
  std::printf(
      "# backward_ms: the slowest rank's backward loop (compute, plus the marks when overlapped);\n"
      "# tail_ms: from the last rank's end of backward to the last rank's end of step (the\n"
      "# reduction left after the last mark, plus the marks and launches in "
      "sync_after_backward)\n#\n");
  std::printf("# %5s  %-20s %9s %9s %9s %11s %9s %13s %12s %9s\n", "ranks", "mode", "step_ms",
              "min_ms", "max_ms", "compute_ms", "comm_ms", "exposed_frac", "backward_ms",
              "tail_ms");
  for (const Row& r : rows) {
    std::printf("  %5d  %-20s %9.2f %9.2f %9.2f %11.2f %9.2f %13.3f %12.2f %9.2f\n", r.ranks,
                ModeName(r.mode), r.step_ms, r.min_ms, r.max_ms, r.compute_ms, r.comm_ms, r.exposed,
                r.backward_ms, r.tail_ms);
  }
  std::printf("#\n");
  const size_t per_count = c.Modes().size();
  for (size_t i = 0; i + per_count <= rows.size(); i += per_count) {
    const Row& sync = rows[i + 2];
    const Row& ovl = rows[i + 3];
    std::printf(
        "# %d ranks: overlapped %.2f ms vs sync_after_backward %.2f ms (%.2fx), hides %.0f%% of "
        "comm_only; exposed %.2f ms: backward %+.2f ms slower than compute_only, %.2f ms tail\n",
        ovl.ranks, ovl.step_ms, sync.step_ms, sync.step_ms / ovl.step_ms,
        100.0 * (1.0 - ovl.exposed), ovl.step_ms - ovl.compute_ms, ovl.backward_ms - ovl.compute_ms,
        ovl.tail_ms);
    const Row& prio = rows[i + per_count - (c.autotune ? 2 : 1)];
    std::printf(
        "# %d ranks: priority (credit %lld B%s%s) %.2f ms vs overlapped %.2f ms (%.2fx); "
        "exposed_frac %.3f vs "
        "%.3f\n",
        prio.ranks, static_cast<long long>(c.credit),
        !c.priorities   ? ", partitions only"
        : c.hold_waited ? ", priorities (hold while waited)"
                        : ", priorities",
        c.aa ? "; --aa: NO scheduler, an A/A check" : "", prio.step_ms, ovl.step_ms,
        ovl.step_ms / prio.step_ms, prio.exposed, ovl.exposed);
    if (c.autotune) {
      const Row& tuned = rows[i + per_count - 1];
      const Row& prio2 = rows[i + per_count - 2];
      std::printf(
          "# %d ranks: autotuned %.2f ms vs overlapped (the default) %.2f ms (%.2fx), priority "
          "%.2f ms\n",
          tuned.ranks, tuned.step_ms, ovl.step_ms, ovl.step_ms / tuned.step_ms, prio2.step_ms);
    }
    if (!c.optimizer) continue;
    const Row& after = rows[i + 4];
    const Row& stepped = rows[i + 5];
    std::printf(
        "# %d ranks, AdamW: optim_overlapped %.2f ms vs optim_after_backward %.2f ms (%.2fx); "
        "exposed "
        "optimizer time (step - overlapped reduction alone) %.2f ms vs %.2f ms\n",
        stepped.ranks, stepped.step_ms, after.step_ms, after.step_ms / stepped.step_ms,
        stepped.step_ms - ovl.step_ms, after.step_ms - ovl.step_ms);
  }
  for (const std::string& note : notes) std::printf("%s\n", note.c_str());
  std::printf("#\n");
  PrintCsv(rows);
}

}  // namespace braid::bench
