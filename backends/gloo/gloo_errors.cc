#include "backends/gloo/gloo_errors.h"

#include <exception>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace braid::gloo_backend {

absl::Status GlooCall(absl::string_view what, const std::function<void()>& call) {
  try {
    call();
    return absl::OkStatus();
  } catch (const ::gloo::IoException& e) {
    const absl::string_view text = e.what();
    if (absl::StrContains(text, "Timed out") || absl::StrContains(text, "timed out") ||
        absl::StrContains(text, "Timeout") || absl::StrContains(text, "timeout")) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": gloo: ", text));
    }
    return absl::UnavailableError(absl::StrCat(what, ": gloo: ", text));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": gloo: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": gloo threw a non-standard exception"));
  }
}

}  // namespace braid::gloo_backend
