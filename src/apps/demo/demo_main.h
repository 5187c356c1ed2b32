// `kvroute demo` (what `make demo` runs): the seed article's comparison, live. `argv[0]`
// is "demo". Returns the process exit code.
#pragma once

namespace kvroute::demo {

int DemoMain(int argc, char** argv);

}  // namespace kvroute::demo
