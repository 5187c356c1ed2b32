// `kvroute serve`: run the router/proxy until SIGINT or SIGTERM; SIGHUP reloads the
// configuration file. `argv[0]` is "serve". Returns the process exit code.
#pragma once

namespace kvroute::router {

int ServeMain(int argc, char** argv);

}  // namespace kvroute::router
