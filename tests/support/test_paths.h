// Where the tests find the source tree and the binaries they start.
//
// The absolute paths are compiled into tests/support/test_paths.cc alone, not into every
// test source as -D definitions: a compiler cache keyed on relative paths (docs/BENCHMARKS.md,
// "CI") then reuses every other test object from a build of another checkout.
#pragma once

#include <string>

namespace kvroute::test_support {

// The source root: $KVROUTE_SOURCE_DIR when set (ctest sets it), else the configured root.
std::string SourceDir();
// The kvroute binary of this build: $KVROUTE_BINARY when set, else the configured target.
std::string KvrouteBinary();
// tests/adapters/k8s/fake_apiserver_main.cc's binary of this build.
std::string FakeKubeApiserver();

}  // namespace kvroute::test_support
