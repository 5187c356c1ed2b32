#include "demo/diagnose.h"

#include <chrono>
#include <thread>

namespace kvroute::demo {

// Stand-in until doctor's collector and rules are implemented (issue 12, part 1): waits
// out the window like the collector would, so the demo's timing is the real one.
Diagnosis DiagnoseFleet(const std::string& policy, const std::vector<DoctorTarget>& targets,
                        double window_s, double interval_s, const std::atomic<bool>* stop) {
  (void)targets;
  (void)interval_s;
  const auto start = std::chrono::steady_clock::now();
  while (!(stop && stop->load()) &&
         std::chrono::steady_clock::now() - start < std::chrono::duration<double>(window_s)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Diagnosis d;
  d.policy = policy;
  d.text = "kvroute doctor is not in this build yet (src/doctor has no implementation).\n";
  d.exit_code = 2;
  return d;
}

}  // namespace kvroute::demo
