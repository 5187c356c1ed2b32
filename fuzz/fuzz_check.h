// Helpers shared by the fuzz targets: an invariant check that aborts (so libFuzzer records
// the input as a crash) and the contract every config loader's error must meet.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "config/yaml_reader.h"

namespace kvroute::fuzz {

inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

// A config error names the file it was given, a line or a field, and says what is wrong.
inline void CheckConfigError(const config::ConfigError& e, std::string_view file) {
  if (e.message.empty() || e.file != file || (e.line <= 0 && e.field.empty())) {
    std::fprintf(stderr, "config error: %s\n", e.ToString().c_str());
    Check(false, "config error without a message, its file, or a line or field");
  }
  Check(!e.ToString().empty(), "empty ConfigError::ToString");
}

}  // namespace kvroute::fuzz
