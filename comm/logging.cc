#include "comm/logging.h"

#include <memory>
#include <string>

#include "spdlog/sinks/stdout_color_sinks.h"

namespace braid {

spdlog::logger& Log() {
  static spdlog::logger* logger = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto* l = new spdlog::logger("braid", sink);
    l->set_pattern("[braid %L %H:%M:%S.%f t%t] %v");
    l->set_level(spdlog::level::warn);
    return l;
  }();
  return *logger;
}

void SetLogLevel(absl::string_view level) {
  const auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") return;
  Log().set_level(lvl);
}

}  // namespace braid
