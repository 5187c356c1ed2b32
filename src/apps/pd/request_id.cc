#include "apps/pd/request_id.h"

#include <cstdio>
#include <random>

namespace kvroute::pd {

std::string NewRequestId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "kvroute-%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace kvroute::pd
