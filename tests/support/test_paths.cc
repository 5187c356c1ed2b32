#include "support/test_paths.h"

#include <cstdlib>

namespace kvroute::test_support {
namespace {

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

}  // namespace

std::string SourceDir() { return EnvOr("KVROUTE_SOURCE_DIR", KVROUTE_TEST_SOURCE_DIR); }
std::string KvrouteBinary() { return EnvOr("KVROUTE_BINARY", KVROUTE_TEST_BINARY); }
std::string FakeKubeApiserver() { return KVROUTE_TEST_FAKE_KUBE_APISERVER; }

}  // namespace kvroute::test_support
