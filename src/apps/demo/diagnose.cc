#include "apps/demo/diagnose.h"

#include "apps/doctor/diagnosis/doctor.h"
#include "apps/doctor/collect.h"

namespace kvroute::demo {

Diagnosis DiagnoseFleet(const std::string& policy, const std::vector<DoctorTarget>& targets,
                        double window_s, double interval_s, const std::atomic<bool>* stop) {
  doctor::CollectOptions co;
  for (const DoctorTarget& t : targets) co.targets.push_back({t.name, t.host, t.port});
  co.window_s = window_s;
  co.interval_s = interval_s;
  co.stop = stop;
  const std::vector<doctor::ReplicaHistory> histories = doctor::Collect(co);
  doctor::DoctorOptions opts;
  opts.window_s = window_s;
  const doctor::Report report = doctor::Diagnose(histories, opts);
  Diagnosis d;
  d.policy = policy;
  d.text = doctor::ReportText(report);
  d.json = doctor::ReportJson(report);
  d.exit_code = report.ExitCode();
  for (const doctor::Finding& f : report.findings) {
    d.findings.push_back(f.rule);
    d.routing_finding = d.routing_finding || f.routing;
  }
  return d;
}

}  // namespace kvroute::demo
