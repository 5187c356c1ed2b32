// `kvroute sidecar`: the decode pod's P/D sidecar (sidecar.h) until SIGINT or SIGTERM.
// `argv[0]` is "sidecar". Returns the process exit code.
#pragma once

namespace kvroute::sidecar {

int SidecarMain(int argc, char** argv);

}  // namespace kvroute::sidecar
