// Braid's spdlog logger ("braid", stderr). Level from Options::log_level (BRAID_LOG_LEVEL).
//
//   Log().warn("rank {} stalled on {}", rank, info.Describe());
#ifndef BRAID_COMM_LOGGING_H_
#define BRAID_COMM_LOGGING_H_

#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace braid {

// The process-wide logger, created on first use (thread-safe).
spdlog::logger& Log();
// Applies a level name ("trace" ... "off"); unknown names leave the level unchanged.
void SetLogLevel(absl::string_view level);

}  // namespace braid

#endif  // BRAID_COMM_LOGGING_H_
