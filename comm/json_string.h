// AppendJsonString: a string as a JSON string literal, for the files Braid writes (the timeline's
// Chrome trace, the flight recorder's dumps).
//
//   std::string out;
//   AppendJsonString("bucket \"3\"\n", &out);   // out == "\"bucket \\\"3\\\"\\n\""
//
// Quotes, backslashes and control characters are escaped (\n, \r, \t by name, the others as
// \u00XX); every other byte, UTF-8 included, passes through unchanged.
#ifndef BRAID_COMM_JSON_STRING_H_
#define BRAID_COMM_JSON_STRING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace braid {

void AppendJsonString(absl::string_view s, std::string* out);

}  // namespace braid

#endif  // BRAID_COMM_JSON_STRING_H_
