// `kvroute epp`: run the ext_proc endpoint picker until SIGINT or SIGTERM; SIGHUP reloads
// the configuration file. `argv[0]` is "epp". Returns the process exit code.
#pragma once

namespace kvroute::epp {

int EppMain(int argc, char** argv);

}  // namespace kvroute::epp
