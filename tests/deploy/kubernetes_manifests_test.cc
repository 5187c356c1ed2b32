// deploy/kubernetes: every manifest parses, and the objects agree with each other and with
// the kvroute binary: the pool selects the model-server pods on their port, its picker
// reference names the picker's Service and ext_proc port, the RBAC lets the picker's
// service account read exactly what it watches, the picker's args name the pool and the
// mounted config, the config passes `kvroute epp --check`, and every flag in the args is
// one the binary's --help lists. No cluster is involved: there is none here.
//
// KVROUTE_K8S_DIR (environment) points the test at another copy of the manifests, which is
// how a deliberate mismatch is tried without touching the tree.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "support/test_paths.h"

namespace {

namespace fs = std::filesystem;

constexpr char kPoolGroup[] = "inference.networking.k8s.io";
constexpr char kPoolGroupV1alpha2[] = "inference.networking.x-k8s.io";
constexpr char kV1alpha2File[] = "inferencepool-v1alpha2.yaml";
constexpr char kVllmFile[] = "vllm-deployment.yaml";
constexpr char kSimFile[] = "sim-deployment.yaml";
// Needs the Prometheus Operator's CRD, which a cluster may not have: applied on its own.
constexpr char kPrometheusRuleFile[] = "prometheusrule.yaml";

fs::path ManifestDir() {
  if (const char* dir = std::getenv("KVROUTE_K8S_DIR"); dir != nullptr && *dir != '\0') return dir;
  return fs::path(kvroute::test_support::SourceDir()) / "deploy" /
         "kubernetes";
}

std::string Binary() {
  return kvroute::test_support::KvrouteBinary();
}

// node[k1][k2]...: an undefined node as soon as a key is missing or a level is no map.
// (yaml-cpp throws when a missing key is indexed again; a broken manifest must fail the
// test with a message, not an exception.)
template <typename... Keys>
YAML::Node Dig(const YAML::Node& node, const Keys&... keys) {
  YAML::Node cur = node;
  for (const std::string& k : {std::string(keys)...}) {
    if (!cur.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& map = cur;
    YAML::Node next = map[k];
    if (!next.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    cur.reset(next);  // operator= would assign into the manifest's node
  }
  return cur;
}

// node[i], or an undefined node when node is no sequence that long.
YAML::Node Nth(const YAML::Node& node, size_t i) {
  if (!node.IsSequence() || node.size() <= i) return YAML::Node(YAML::NodeType::Undefined);
  return node[i];
}

struct Object {
  std::string file;
  YAML::Node node;
  std::string Kind() const { return node["kind"].as<std::string>(""); }
  std::string Name() const { return Dig(node, "metadata", "name").as<std::string>(""); }
  std::string Namespace() const { return Dig(node, "metadata", "namespace").as<std::string>(""); }
  std::string Where() const { return file + ": " + Kind() + " " + Name(); }
};

// The group of an apiVersion: "" for the core group's "v1".
std::string GroupOf(const std::string& api_version) {
  const auto slash = api_version.find('/');
  return slash == std::string::npos ? "" : api_version.substr(0, slash);
}

// Every manifest of the directory, parsed once. A file that does not parse is recorded in
// `errors` (the ParseEveryFile test reports them), the others still load.
struct Manifests {
  std::vector<Object> objects;
  std::vector<std::string> errors;
  std::vector<std::string> files;  // every *.yaml but kustomization.yaml, sorted
  YAML::Node kustomization;

  static const Manifests& Get() {
    static const Manifests* m = new Manifests(Load(ManifestDir()));
    return *m;
  }

  static Manifests Load(const fs::path& dir) {
    Manifests m;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() != ".yaml") continue;
      const std::string name = entry.path().filename().string();
      try {
        if (name == "kustomization.yaml") {
          m.kustomization = YAML::LoadFile(entry.path().string());
          continue;
        }
        m.files.push_back(name);
        for (const YAML::Node& doc : YAML::LoadAllFromFile(entry.path().string())) {
          if (doc.IsNull()) continue;  // an empty document between two "---"
          m.objects.push_back({name, doc});
        }
      } catch (const YAML::Exception& e) {
        m.errors.push_back(name + ": " + e.what());
      }
    }
    if (ec) m.errors.push_back(dir.string() + ": " + ec.message());
    std::sort(m.files.begin(), m.files.end());
    return m;
  }

  // The objects of `kind` (and of `file`, when given).
  std::vector<const Object*> OfKind(const std::string& kind, const std::string& file = "") const {
    std::vector<const Object*> out;
    for (const Object& o : objects) {
      if (o.Kind() == kind && (file.empty() || o.file == file)) out.push_back(&o);
    }
    return out;
  }

  const Object* Find(const std::string& kind, const std::string& name) const {
    for (const Object& o : objects) {
      if (o.Kind() == kind && o.Name() == name) return &o;
    }
    return nullptr;
  }

  // The single object of `kind` in `file`; a test failure (and nullptr) otherwise.
  const Object* One(const std::string& kind, const std::string& file) const {
    auto found = OfKind(kind, file);
    EXPECT_EQ(found.size(), 1u) << "expected one " << kind << " in " << file;
    return found.size() == 1 ? found[0] : nullptr;
  }

  const Object* Pool() const { return One("InferencePool", "inferencepool.yaml"); }
  const Object* PoolV1alpha2() const { return One("InferencePool", kV1alpha2File); }
  const Object* Picker() const { return One("Deployment", "epp-deployment.yaml"); }
  const Object* PickerService() const { return One("Service", "epp-service.yaml"); }
};

// The labels of a map node ({} when absent).
std::map<std::string, std::string> Labels(const YAML::Node& map) {
  std::map<std::string, std::string> out;
  if (!map || !map.IsMap()) return out;
  for (const auto& kv : map) out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  return out;
}

// True when every label of `selector` is in `labels` with the same value; an empty
// selector selects nothing here (an InferencePool or Service selecting every pod is a bug).
bool Selects(const std::map<std::string, std::string>& selector,
             const std::map<std::string, std::string>& labels) {
  if (selector.empty()) return false;
  for (const auto& [k, v] : selector) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

std::string Show(const std::map<std::string, std::string>& labels) {
  std::string out = "{";
  for (const auto& [k, v] : labels) out += (out.size() > 1 ? ", " : "") + k + ": " + v;
  return out + "}";
}

YAML::Node PodSpec(const Object& deployment) {
  return Dig(deployment.node, "spec", "template", "spec");
}

std::map<std::string, std::string> PodLabels(const Object& deployment) {
  return Labels(Dig(deployment.node, "spec", "template", "metadata", "labels"));
}

YAML::Node FirstContainer(const Object& deployment) {
  return Nth(Dig(PodSpec(deployment), "containers"), 0);
}

// containerPort numbers by port name, and the set of numbers, over every container.
struct ContainerPorts {
  std::map<std::string, int> by_name;
  std::set<int> numbers;
};

ContainerPorts PortsOf(const Object& deployment) {
  ContainerPorts out;
  for (const YAML::Node& c : PodSpec(deployment)["containers"]) {
    for (const YAML::Node& p : c["ports"]) {
      const int n = p["containerPort"].as<int>(0);
      out.numbers.insert(n);
      if (p["name"]) out.by_name[p["name"].as<std::string>()] = n;
    }
  }
  return out;
}

// A port given as a number or as a container port's name, as Services and probes allow;
// nullopt when the name is no container port's.
std::optional<int> ResolvePort(const YAML::Node& port, const ContainerPorts& ports) {
  if (!port) return std::nullopt;
  const std::string text = port.as<std::string>();
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos)
    return std::stoi(text);
  auto it = ports.by_name.find(text);
  if (it == ports.by_name.end()) return std::nullopt;
  return it->second;
}

// A container's args with $(VAR) expanded as the kubelet does, from the container's env:
// a literal value, or the Downward API's metadata.namespace (the pod's namespace, which is
// the Deployment's). A reference it cannot resolve is left as written, as the kubelet does.
std::vector<std::string> ExpandedArgs(const Object& deployment, const YAML::Node& container) {
  std::map<std::string, std::string> env;
  for (const YAML::Node& e : container["env"]) {
    const std::string name = e["name"].as<std::string>();
    if (e["value"]) {
      env[name] = e["value"].as<std::string>();
    } else if (Dig(e, "valueFrom", "fieldRef", "fieldPath").as<std::string>("") ==
               "metadata.namespace") {
      env[name] = deployment.Namespace();
    }
  }
  std::vector<std::string> out;
  for (const YAML::Node& a : container["args"]) {
    std::string arg = a.as<std::string>();
    std::string expanded;
    for (size_t i = 0; i < arg.size();) {
      if (arg.compare(i, 3, "$$(") == 0) {
        expanded += "$(";
        i += 3;
        continue;
      }
      if (arg.compare(i, 2, "$(") == 0) {
        const size_t close = arg.find(')', i);
        if (close != std::string::npos) {
          auto it = env.find(arg.substr(i + 2, close - i - 2));
          if (it != env.end()) {
            expanded += it->second;
            i = close + 1;
            continue;
          }
        }
      }
      expanded += arg[i++];
    }
    out.push_back(expanded);
  }
  return out;
}

// A command line: the subcommand (first word that is not a flag), then each flag with its
// value ("--x=v" or "--x v"; "" for a flag given alone), in order.
struct CommandLine {
  std::string subcommand;
  std::vector<std::pair<std::string, std::string>> flags;

  std::optional<std::string> Value(const std::string& flag) const {
    for (const auto& [f, v] : flags) {
      if (f == flag) return v;
    }
    return std::nullopt;
  }
};

CommandLine ParseArgs(const std::vector<std::string>& args) {
  CommandLine out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("-", 0) != 0) {
      if (out.subcommand.empty() && out.flags.empty()) out.subcommand = a;
      continue;
    }
    const auto eq = a.find('=');
    if (eq != std::string::npos) {
      out.flags.emplace_back(a.substr(0, eq), a.substr(eq + 1));
    } else if (i + 1 < args.size() && args[i + 1].rfind("-", 0) != 0) {
      out.flags.emplace_back(a, args[i + 1]);
      ++i;
    } else {
      out.flags.emplace_back(a, "");
    }
  }
  return out;
}

CommandLine PickerCommandLine(const Object& picker) {
  return ParseArgs(ExpandedArgs(picker, FirstContainer(picker)));
}

// Runs `argv` (no shell), returning its exit status and everything it wrote to stdout and
// stderr; status -1 when it could not be started.
std::pair<int, std::string> RunProcess(const std::vector<std::string>& argv) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return {-1, "pipe failed"};
  const pid_t pid = fork();
  if (pid < 0) return {-1, "fork failed"};
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    std::vector<char*> cargv;
    for (const std::string& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(pipefd[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The flags `kvroute SUBCOMMAND --help` lists: "-c", "--config", "--grpc-port", ... read
// from the option lines ("  -c,--config TEXT:FILE REQUIRED", "  --host TEXT=0.0.0.0").
std::set<std::string> HelpFlags(const std::string& subcommand, std::string* help_out = nullptr) {
  auto [status, help] = RunProcess({Binary(), subcommand, "--help"});
  if (help_out != nullptr) *help_out = help;
  std::set<std::string> flags;
  if (status != 0) return flags;
  static const std::regex kOptionLine(R"(^\s{1,8}((?:-[A-Za-z0-9],)?--[A-Za-z0-9][A-Za-z0-9-]*))");
  static const std::regex kFlag(R"(--?[A-Za-z0-9][A-Za-z0-9-]*)");
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, kOptionLine)) continue;
    const std::string names = m[1];
    for (std::sregex_iterator it(names.begin(), names.end(), kFlag), end; it != end; ++it) {
      flags.insert(it->str());
    }
  }
  return flags;
}

// The flags of `cmd` that `help_flags` does not list, comma-separated ("" when none).
std::string UnknownFlags(const CommandLine& cmd, const std::set<std::string>& help_flags) {
  std::string out;
  for (const auto& [flag, value] : cmd.flags) {
    if (help_flags.count(flag) == 0) out += (out.empty() ? "" : ", ") + flag;
  }
  return out;
}

// ---------------------------------------------------------------------------------------

TEST(DeployKubernetes, EveryFileParsesAndTheKustomizationListsThem) {
  const Manifests& m = Manifests::Get();
  EXPECT_TRUE(m.errors.empty()) << ::testing::PrintToString(m.errors);
  ASSERT_FALSE(m.objects.empty()) << "no manifests in " << ManifestDir();
  for (const Object& o : m.objects) {
    EXPECT_FALSE(o.node["apiVersion"].as<std::string>("").empty())
        << o.file << ": a document without apiVersion";
    EXPECT_FALSE(o.Kind().empty()) << o.file << ": a document without kind";
    EXPECT_FALSE(o.Name().empty()) << o.file << ": a " << o.Kind() << " without metadata.name";
    // Namespaced objects say where they go, so the RBAC and the pool's namespace agree.
    EXPECT_FALSE(o.Namespace().empty()) << o.Where() << ": no metadata.namespace";
  }

  ASSERT_TRUE(m.kustomization.IsMap()) << "kustomization.yaml is missing or empty";
  EXPECT_EQ(m.kustomization["kind"].as<std::string>(""), "Kustomization");
  std::set<std::string> listed;
  for (const YAML::Node& r : m.kustomization["resources"]) listed.insert(r.as<std::string>());
  for (const std::string& r : listed) {
    EXPECT_TRUE(fs::exists(ManifestDir() / r))
        << "kustomization.yaml lists " << r << ", which does not exist";
  }
  // Listed by default: every file but the v1alpha2 pool and the model-server Deployment
  // not chosen. Exactly one of vLLM and the simulator: both would join the pool.
  EXPECT_EQ(listed.count(kV1alpha2File), 0u)
      << kV1alpha2File << " is the alternative form, not a default";
  EXPECT_EQ(listed.count(kVllmFile) + listed.count(kSimFile), 1u)
      << "kustomization.yaml must list exactly one of " << kVllmFile << " and " << kSimFile;
  EXPECT_EQ(listed.count(kPrometheusRuleFile), 0u)
      << kPrometheusRuleFile << " needs the Prometheus Operator's CRD; `kubectl apply -k` "
      << "would fail on a cluster without it";
  for (const std::string& f : m.files) {
    if (f == kV1alpha2File || f == kVllmFile || f == kSimFile || f == kPrometheusRuleFile) continue;
    EXPECT_EQ(listed.count(f), 1u) << f << " is not listed in kustomization.yaml";
  }
}

TEST(DeployKubernetes, EveryObjectIsInThePoolsNamespace) {
  const Manifests& m = Manifests::Get();
  const Object* pool = m.Pool();
  ASSERT_NE(pool, nullptr);
  for (const Object& o : m.objects) {
    EXPECT_EQ(o.Namespace(), pool->Namespace()) << o.Where();
  }
}

TEST(DeployKubernetes, PoolSelectsTheModelServerPodsOnTheirPort) {
  const Manifests& m = Manifests::Get();
  const Object* pool = m.Pool();
  const Object* pool_v1alpha2 = m.PoolV1alpha2();
  ASSERT_NE(pool, nullptr);
  ASSERT_NE(pool_v1alpha2, nullptr);
  EXPECT_EQ(pool->node["apiVersion"].as<std::string>(""), std::string(kPoolGroup) + "/v1");
  EXPECT_EQ(pool_v1alpha2->node["apiVersion"].as<std::string>(""),
            std::string(kPoolGroupV1alpha2) + "/v1alpha2");
  EXPECT_EQ(pool_v1alpha2->Name(), pool->Name())
      << "the two forms of the pool should be interchangeable";

  const auto selector = Labels(Dig(pool->node, "spec", "selector", "matchLabels"));
  const auto selector_v1alpha2 = Labels(Dig(pool_v1alpha2->node, "spec", "selector"));
  EXPECT_EQ(selector, selector_v1alpha2);
  std::set<int> target_ports;
  for (const YAML::Node& p : Dig(pool->node, "spec", "targetPorts"))
    target_ports.insert(p["number"].as<int>(0));
  ASSERT_FALSE(target_ports.empty()) << "the pool has no targetPorts";
  EXPECT_LE(target_ports.size(), 8u);
  const int target_port_v1alpha2 = Dig(pool_v1alpha2->node, "spec", "targetPortNumber").as<int>(0);
  EXPECT_EQ(target_ports, std::set<int>{target_port_v1alpha2});

  for (const char* file : {kVllmFile, kSimFile}) {
    const Object* d = m.One("Deployment", file);
    ASSERT_NE(d, nullptr);
    const auto pod_labels = PodLabels(*d);
    EXPECT_TRUE(Selects(selector, pod_labels))
        << "pool selector " << Show(selector) << " does not select " << d->Where() << "'s pods "
        << Show(pod_labels);
    EXPECT_TRUE(Selects(Labels(Dig(d->node, "spec", "selector", "matchLabels")), pod_labels))
        << d->Where() << ": its selector does not match its own pod template";
    const ContainerPorts ports = PortsOf(*d);
    for (int p : target_ports) {
      EXPECT_EQ(ports.numbers.count(p), 1u)
          << "pool targetPort " << p << " is no containerPort of " << d->Where();
    }
    // The model servers are ready when they answer /health on that port.
    const YAML::Node probe = Dig(FirstContainer(*d), "readinessProbe", "httpGet");
    EXPECT_EQ(probe["path"].as<std::string>(""), "/health") << d->Where();
    EXPECT_EQ(ResolvePort(probe["port"], ports), std::optional<int>(*target_ports.begin()))
        << d->Where();
  }
  // No other pods carry the pool's labels (the picker's own pods least of all).
  for (const Object* d : m.OfKind("Deployment")) {
    if (d->file == kVllmFile || d->file == kSimFile) continue;
    EXPECT_FALSE(Selects(selector, PodLabels(*d))) << "the pool would also select " << d->Where();
  }
}

TEST(DeployKubernetes, VllmServesTheModelWithPrefixCachingOnAGpu) {
  const Manifests& m = Manifests::Get();
  const Object* vllm = m.One("Deployment", kVllmFile);
  ASSERT_NE(vllm, nullptr);
  const YAML::Node c = FirstContainer(*vllm);
  EXPECT_EQ(c["image"].as<std::string>("").rfind("vllm/vllm-openai", 0), 0u);
  const CommandLine cmd = ParseArgs(ExpandedArgs(*vllm, c));
  EXPECT_TRUE(cmd.Value("--enable-prefix-caching").has_value());
  EXPECT_EQ(cmd.Value("--model").value_or(""), "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(cmd.Value("--port").value_or(""), "8000");
  EXPECT_EQ(Dig(c, "resources", "limits", "nvidia.com/gpu").as<std::string>(""), "1");
}

TEST(DeployKubernetes, EndpointPickerRefNamesThePickerServiceAndItsExtProcPort) {
  const Manifests& m = Manifests::Get();
  const Object* pool = m.Pool();
  const Object* pool_v1alpha2 = m.PoolV1alpha2();
  const Object* service = m.PickerService();
  const Object* picker = m.Picker();
  ASSERT_TRUE(pool && pool_v1alpha2 && service && picker);

  const YAML::Node ref = Dig(pool->node, "spec", "endpointPickerRef");
  EXPECT_EQ(ref["name"].as<std::string>(""), service->Name());
  EXPECT_EQ(ref["failureMode"].as<std::string>(""), "FailClose");
  const int ref_port = Dig(ref, "port", "number").as<int>(0);
  EXPECT_EQ(ref_port, 9002);
  const YAML::Node ext = Dig(pool_v1alpha2->node, "spec", "extensionRef");
  EXPECT_EQ(ext["name"].as<std::string>(""), service->Name());
  EXPECT_EQ(ext["portNumber"].as<int>(0), ref_port);

  // That Service port leads to the container port the picker's --grpc-port opens.
  const ContainerPorts ports = PortsOf(*picker);
  const std::string grpc_port = PickerCommandLine(*picker).Value("--grpc-port").value_or("9002");
  bool found = false;
  for (const YAML::Node& p : Dig(service->node, "spec", "ports")) {
    if (p["port"].as<int>(0) != ref_port) continue;
    found = true;
    EXPECT_EQ(ResolvePort(p["targetPort"] ? p["targetPort"] : p["port"], ports),
              std::optional<int>(std::stoi(grpc_port)))
        << "Service port " << ref_port << " does not lead to the picker's --grpc-port "
        << grpc_port;
    EXPECT_EQ(p["appProtocol"].as<std::string>(""), "http2") << "ext_proc is gRPC: HTTP/2";
  }
  EXPECT_TRUE(found) << service->Where() << " has no port " << ref_port;
}

TEST(DeployKubernetes, PickerServiceSelectsThePickerPodsOnItsContainerPorts) {
  const Manifests& m = Manifests::Get();
  const Object* service = m.PickerService();
  const Object* picker = m.Picker();
  ASSERT_TRUE(service && picker);
  const auto selector = Labels(Dig(service->node, "spec", "selector"));
  EXPECT_TRUE(Selects(selector, PodLabels(*picker)))
      << service->Where() << " selector " << Show(selector) << " does not select "
      << Show(PodLabels(*picker));
  EXPECT_TRUE(
      Selects(Labels(Dig(picker->node, "spec", "selector", "matchLabels")), PodLabels(*picker)));

  // 9002 ext_proc, 9003 gRPC health, 9090 metrics, each named as its container port.
  const ContainerPorts ports = PortsOf(*picker);
  std::set<int> service_ports;
  for (const YAML::Node& p : Dig(service->node, "spec", "ports")) {
    const int port = p["port"].as<int>(0);
    service_ports.insert(port);
    const std::optional<int> target =
        ResolvePort(p["targetPort"] ? p["targetPort"] : p["port"], ports);
    ASSERT_TRUE(target.has_value())
        << service->Where() << " port " << port << ": targetPort "
        << p["targetPort"].as<std::string>("") << " is no container port";
    EXPECT_EQ(ports.numbers.count(*target), 1u)
        << service->Where() << " port " << port << " -> " << *target;
    const std::string name = p["name"].as<std::string>("");
    ASSERT_EQ(ports.by_name.count(name), 1u)
        << "Service port name " << name << " is no container port's name";
    EXPECT_EQ(ports.by_name.at(name), *target)
        << "Service port " << name << " leads to another container port";
  }
  EXPECT_EQ(service_ports, (std::set<int>{9002, 9003, 9090}));

  // Every Service in the tree selects some Deployment's pods.
  for (const Object* s : m.OfKind("Service")) {
    bool selects = false;
    for (const Object* d : m.OfKind("Deployment"))
      selects = selects || Selects(Labels(Dig(s->node, "spec", "selector")), PodLabels(*d));
    EXPECT_TRUE(selects) << s->Where() << " selects no Deployment's pods";
  }
}

TEST(DeployKubernetes, PickerPortsAndProbesAgreeWithItsFlags) {
  const Manifests& m = Manifests::Get();
  const Object* picker = m.Picker();
  ASSERT_NE(picker, nullptr);
  const CommandLine cmd = PickerCommandLine(*picker);
  const ContainerPorts ports = PortsOf(*picker);
  const int grpc = std::stoi(cmd.Value("--grpc-port").value_or("9002"));
  const int health = std::stoi(cmd.Value("--grpc-health-port").value_or("9003"));
  const int metrics = std::stoi(cmd.Value("--metrics-port").value_or("9090"));
  EXPECT_EQ(ports.numbers, (std::set<int>{grpc, health, metrics}));
  EXPECT_EQ(cmd.Value("--host").value_or("0.0.0.0"), "0.0.0.0")
      << "the gateway and the kubelet connect from outside the pod";
  // ext_proc over TLS (the default, as the reference picker); the probes below reach the
  // plaintext health and metrics ports only.
  EXPECT_EQ(cmd.Value("--secure-serving").value_or("true"), "true");

  const YAML::Node c = FirstContainer(*picker);
  const YAML::Node ready = c["readinessProbe"];
  if (ready["grpc"]) {
    EXPECT_EQ(Dig(ready, "grpc", "port").as<int>(0), health);
    EXPECT_EQ(Dig(ready, "grpc", "service").as<std::string>(""), "readiness")
        << "the empty service name is SERVING from the start; readiness follows the pool";
  } else {
    EXPECT_EQ(Dig(ready, "httpGet", "path").as<std::string>(""), "/readyz");
    EXPECT_EQ(ResolvePort(Dig(ready, "httpGet", "port"), ports), std::optional<int>(metrics));
  }
  const YAML::Node live = Dig(c, "livenessProbe", "httpGet");
  EXPECT_EQ(live["path"].as<std::string>(""), "/healthz");
  EXPECT_EQ(ResolvePort(live["port"], ports), std::optional<int>(metrics));
}

TEST(DeployKubernetes, RoleBindingBindsTheRoleToThePickersServiceAccount) {
  const Manifests& m = Manifests::Get();
  const Object* picker = m.Picker();
  ASSERT_NE(picker, nullptr);
  const std::string sa_name = PodSpec(*picker)["serviceAccountName"].as<std::string>("");
  ASSERT_FALSE(sa_name.empty()) << picker->Where()
                                << " runs as the namespace's default service account";
  const Object* sa = m.Find("ServiceAccount", sa_name);
  ASSERT_NE(sa, nullptr) << "no ServiceAccount " << sa_name;
  EXPECT_EQ(sa->Namespace(), picker->Namespace());

  auto bindings = m.OfKind("RoleBinding");
  ASSERT_EQ(bindings.size(), 1u);
  const Object& rb = *bindings[0];
  EXPECT_EQ(rb.Namespace(), picker->Namespace());
  const YAML::Node role_ref = rb.node["roleRef"];
  EXPECT_EQ(role_ref["apiGroup"].as<std::string>(""), "rbac.authorization.k8s.io");
  EXPECT_EQ(role_ref["kind"].as<std::string>(""), "Role");
  const Object* role = m.Find("Role", role_ref["name"].as<std::string>(""));
  ASSERT_NE(role, nullptr) << rb.Where() << " refers to a Role that is not here";
  EXPECT_EQ(role->Namespace(), rb.Namespace());
  bool bound = false;
  for (const YAML::Node& s : rb.node["subjects"]) {
    // A ServiceAccount subject without namespace is an error at admission.
    bound = bound || (s["kind"].as<std::string>("") == "ServiceAccount" &&
                      s["name"].as<std::string>("") == sa_name &&
                      s["namespace"].as<std::string>("") == sa->Namespace());
  }
  EXPECT_TRUE(bound) << rb.Where() << " does not bind ServiceAccount " << sa_name << " in "
                     << sa->Namespace();
  EXPECT_TRUE(m.OfKind("ClusterRole").empty() && m.OfKind("ClusterRoleBinding").empty())
      << "the picker reads its own namespace only";
}

TEST(DeployKubernetes, RoleGrantsExactlyGetListWatchOnWhatThePickerReads) {
  const Manifests& m = Manifests::Get();
  auto roles = m.OfKind("Role");
  ASSERT_EQ(roles.size(), 1u);
  using Grant = std::tuple<std::string, std::string, std::string>;  // group, resource, verb
  std::set<Grant> granted;
  for (const YAML::Node& rule : roles[0]->node["rules"]) {
    EXPECT_FALSE(rule["resourceNames"]) << "list and watch cannot be limited to names";
    EXPECT_FALSE(rule["nonResourceURLs"]);
    for (const YAML::Node& g : rule["apiGroups"]) {
      for (const YAML::Node& r : rule["resources"]) {
        for (const YAML::Node& v : rule["verbs"])
          granted.insert({g.as<std::string>(), r.as<std::string>(), v.as<std::string>()});
      }
    }
  }
  std::set<Grant> wanted;
  for (const auto& [group, resource] : std::vector<std::pair<std::string, std::string>>{
           {"", "pods"},
           {kPoolGroup, "inferencepools"},
           {kPoolGroupV1alpha2, "inferencepools"},
           {"llm-d.ai", "inferenceobjectives"},
           {kPoolGroupV1alpha2, "inferenceobjectives"}}) {
    for (const char* verb : {"get", "list", "watch"}) wanted.insert({group, resource, verb});
  }
  std::string missing, extra;
  for (const Grant& g : wanted) {
    if (!granted.count(g))
      missing += " " + std::get<2>(g) + " " + std::get<1>(g) + "." + std::get<0>(g);
  }
  for (const Grant& g : granted) {
    if (!wanted.count(g))
      extra += " " + std::get<2>(g) + " " + std::get<1>(g) + "." + std::get<0>(g);
  }
  EXPECT_TRUE(missing.empty()) << "not granted:" << missing;
  EXPECT_TRUE(extra.empty()) << "granted beyond what the picker reads:" << extra;
}

TEST(DeployKubernetes, PickerArgsNameThePoolInItsNamespaceAndGroup) {
  const Manifests& m = Manifests::Get();
  const Object* pool = m.Pool();
  const Object* picker = m.Picker();
  ASSERT_TRUE(pool && picker);
  const CommandLine cmd = PickerCommandLine(*picker);
  EXPECT_EQ(Nth(Dig(FirstContainer(*picker), "command"), 0).as<std::string>(""), "kvroute");
  EXPECT_EQ(cmd.subcommand, "epp");
  EXPECT_EQ(cmd.Value("--pool-name").value_or("(not given)"), pool->Name());
  EXPECT_EQ(cmd.Value("--pool-namespace").value_or("(not given)"), pool->Namespace());
  // --pool-group defaults to the v1 group; given, it must be the pool's.
  EXPECT_EQ(cmd.Value("--pool-group").value_or(kPoolGroup),
            GroupOf(pool->node["apiVersion"].as<std::string>("")));
  EXPECT_FALSE(cmd.Value("--kubeconfig").has_value())
      << "in the cluster the service account is used";
}

TEST(DeployKubernetes, ConfigMapIsMountedWhereConfigPoints) {
  const Manifests& m = Manifests::Get();
  const Object* picker = m.Picker();
  ASSERT_NE(picker, nullptr);
  const std::string config = PickerCommandLine(*picker)
                                 .Value("--config")
                                 .value_or(PickerCommandLine(*picker).Value("-c").value_or(""));
  ASSERT_FALSE(config.empty()) << "the picker's args give no --config";

  // Which ConfigMap key lands at `config`: a volume mounted at its directory (key = file
  // name, or the path an `items` entry gives it), or mounted on the file with subPath.
  std::map<std::string, YAML::Node> volumes;
  for (const YAML::Node& v : PodSpec(*picker)["volumes"])
    volumes.emplace(v["name"].as<std::string>(""), v);
  std::string cm_name, key;
  for (const YAML::Node& vm : FirstContainer(*picker)["volumeMounts"]) {
    const fs::path mount = vm["mountPath"].as<std::string>("");
    const YAML::Node cm = Dig(volumes[vm["name"].as<std::string>("")], "configMap");
    if (!cm) continue;
    std::string file;
    if (vm["subPath"]) {
      if (mount != fs::path(config)) continue;
      file = vm["subPath"].as<std::string>();
    } else {
      if (fs::path(config).parent_path() != mount.lexically_normal()) continue;
      file = fs::path(config).filename().string();
    }
    std::string k = file;
    if (cm["items"]) {
      k.clear();
      for (const YAML::Node& item : cm["items"]) {
        if (item["path"].as<std::string>("") == file) k = item["key"].as<std::string>("");
      }
    }
    cm_name = cm["name"].as<std::string>("");
    key = k;
  }
  ASSERT_FALSE(cm_name.empty()) << "no ConfigMap volume is mounted at " << config;
  const Object* cm = m.Find("ConfigMap", cm_name);
  ASSERT_NE(cm, nullptr) << "the picker mounts ConfigMap " << cm_name << ", which is not here";
  EXPECT_EQ(cm->Name(), "kvroute-epp-config");
  EXPECT_TRUE(Dig(cm->node, "data", key).IsScalar())
      << cm->Where() << " has no key " << key << " for " << config;
}

TEST(DeployKubernetes, ConfigMapConfigPassesEppCheck) {
  const Manifests& m = Manifests::Get();
  const Object* cm = m.Find("ConfigMap", "kvroute-epp-config");
  ASSERT_NE(cm, nullptr);
  const std::string text = Dig(cm->node, "data", "config.yaml").as<std::string>("");
  ASSERT_FALSE(text.empty());
  // The seed article's profile: prefix 3, KV utilisation 2, queue depth 1.
  const YAML::Node config = YAML::Load(text);
  std::map<std::string, int> weights;
  for (const YAML::Node& p : Dig(Nth(Dig(config, "schedulingProfiles"), 0), "plugins")) {
    weights[p["pluginRef"].as<std::string>()] = p["weight"].as<int>(1);
  }
  EXPECT_EQ(weights, (std::map<std::string, int>{{"prefix-cache-scorer", 3},
                                                 {"kv-cache-utilization-scorer", 2},
                                                 {"queue-depth-scorer", 1}}));

  char dir_template[] = "/tmp/kvroute-deploy-k8s-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const fs::path file = fs::path(dir_template) / "config.yaml";
  std::ofstream(file) << text;
  auto [status, out] = RunProcess({Binary(), "epp", "--check", "-c", file.string()});
  fs::remove_all(dir_template);
  EXPECT_EQ(status, 0) << "kvroute epp --check -c config.yaml:\n" << out;
}

TEST(DeployKubernetes, EveryPickerFlagIsOneKvrouteEppAccepts) {
  const Manifests& m = Manifests::Get();
  const Object* picker = m.Picker();
  ASSERT_NE(picker, nullptr);
  std::string help;
  const std::set<std::string> flags = HelpFlags("epp", &help);
  ASSERT_TRUE(flags.count("--config")) << Binary() << " epp --help did not list its flags:\n"
                                       << help;
  const std::string unknown = UnknownFlags(PickerCommandLine(*picker), flags);
  EXPECT_TRUE(unknown.empty()) << "flags in " << picker->Where() << " that " << Binary()
                               << " epp --help does not list: " << unknown;
}

// The picker's whole command line, values included (--pool-group is a closed set, ports a
// range), through `kvroute epp --check`: the args as the kubelet passes them, with the
// ConfigMap's file in a temp directory standing in for the mounted path.
TEST(DeployKubernetes, PickerArgsWithTheConfigMapPassEppCheck) {
  const Manifests& m = Manifests::Get();
  const Object* picker = m.Picker();
  const Object* cm = m.Find("ConfigMap", "kvroute-epp-config");
  ASSERT_TRUE(picker && cm);
  char dir_template[] = "/tmp/kvroute-deploy-k8s-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const fs::path file = fs::path(dir_template) / "config.yaml";
  std::ofstream(file) << Dig(cm->node, "data", "config.yaml").as<std::string>("");

  std::vector<std::string> argv = {Binary()};
  const std::vector<std::string> args = ExpandedArgs(*picker, FirstContainer(*picker));
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--config=", 0) == 0 || a.rfind("-c=", 0) == 0) {
      argv.push_back("--config=" + file.string());
    } else if (a == "--config" || a == "-c") {
      argv.push_back(a);
      argv.push_back(file.string());
      ++i;
    } else {
      argv.push_back(a);
    }
  }
  argv.push_back("--check");
  auto [status, out] = RunProcess(argv);
  fs::remove_all(dir_template);
  std::string line;
  for (const std::string& a : argv) line += (line.empty() ? "" : " ") + a;
  EXPECT_EQ(status, 0) << line << "\n" << out;
}

TEST(DeployKubernetes, EverySimFlagIsOneKvrouteSimAccepts) {
  const Manifests& m = Manifests::Get();
  const Object* sim = m.One("Deployment", kSimFile);
  ASSERT_NE(sim, nullptr);
  const YAML::Node c = FirstContainer(*sim);
  const CommandLine cmd = ParseArgs(ExpandedArgs(*sim, c));
  EXPECT_EQ(Nth(Dig(c, "command"), 0).as<std::string>(""), "kvroute");
  EXPECT_EQ(cmd.subcommand, "sim");
  std::string help;
  const std::set<std::string> flags = HelpFlags("sim", &help);
  ASSERT_TRUE(flags.count("--port")) << Binary() << " sim --help did not list its flags:\n" << help;
  const std::string unknown = UnknownFlags(cmd, flags);
  EXPECT_TRUE(unknown.empty()) << "flags in " << sim->Where()
                               << " that kvroute sim does not list: " << unknown;
  // One replica per pod, on the pool's port, reachable from other pods.
  EXPECT_EQ(cmd.Value("--replicas").value_or(cmd.Value("-n").value_or("1")), "1");
  EXPECT_EQ(cmd.Value("--port").value_or(cmd.Value("-p").value_or("8000")), "8000");
  EXPECT_EQ(cmd.Value("--host").value_or("127.0.0.1"), "0.0.0.0");
}

TEST(DeployKubernetes, HttpRouteSendsToThePoolThroughTheGateway) {
  const Manifests& m = Manifests::Get();
  const Object* pool = m.Pool();
  const Object* route = m.One("HTTPRoute", "httproute.yaml");
  ASSERT_TRUE(pool && route);
  EXPECT_EQ(route->node["apiVersion"].as<std::string>(""), "gateway.networking.k8s.io/v1");
  int refs = 0;
  for (const YAML::Node& rule : Dig(route->node, "spec", "rules")) {
    for (const YAML::Node& ref : rule["backendRefs"]) {
      ++refs;
      EXPECT_EQ(ref["group"].as<std::string>(""),
                GroupOf(pool->node["apiVersion"].as<std::string>("")));
      EXPECT_EQ(ref["kind"].as<std::string>(""), "InferencePool");
      EXPECT_EQ(ref["name"].as<std::string>(""), pool->Name());
      EXPECT_EQ(ref["namespace"].as<std::string>(route->Namespace()), pool->Namespace());
    }
  }
  EXPECT_GT(refs, 0) << route->Where() << " has no backendRefs";
  // Its parent is the example Gateway, when that is here.
  for (const Object* gw : m.OfKind("Gateway")) {
    bool attached = false;
    for (const YAML::Node& p : Dig(route->node, "spec", "parentRefs")) {
      attached =
          attached || (p["name"].as<std::string>("") == gw->Name() &&
                       p["namespace"].as<std::string>(route->Namespace()) == gw->Namespace());
    }
    EXPECT_TRUE(attached) << route->Where() << " is not attached to " << gw->Where();
  }
}

// ---------------------------------------------------------------------------------------
// deploy/kubernetes-pd: the prefill/decode overlay (issue 25). Its kustomization takes
// deploy/kubernetes whole, deletes the aggregated vLLM Deployment and adds prefill pods
// (vLLM on the pool's port) and decode pods (the kvroute sidecar on the pool's port in
// front of vLLM). KVROUTE_K8S_PD_DIR points the test at another copy.

fs::path PdDir() {
  if (const char* dir = std::getenv("KVROUTE_K8S_PD_DIR"); dir != nullptr && *dir != '\0') return dir;
  return fs::path(kvroute::test_support::SourceDir()) / "deploy" / "kubernetes-pd";
}

const Manifests& Pd() {
  static const Manifests* m = new Manifests(Manifests::Load(PdDir()));
  return *m;
}

// The container of `deployment` named `name`; an undefined node when there is none.
YAML::Node Container(const Object& deployment, const std::string& name) {
  for (const YAML::Node& c : PodSpec(deployment)["containers"]) {
    if (c["name"].as<std::string>("") == name) return c;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

int PoolTargetPort() {
  const Object* pool = Manifests::Get().Pool();
  if (pool == nullptr) return 0;
  return Nth(Dig(pool->node, "spec", "targetPorts"), 0)["number"].as<int>(0);
}

TEST(DeployKubernetesPd, TheOverlayTakesTheBaseAndReplacesItsModelServers) {
  const Manifests& pd = Pd();
  EXPECT_TRUE(pd.errors.empty()) << ::testing::PrintToString(pd.errors);
  ASSERT_TRUE(pd.kustomization.IsMap()) << PdDir() << "/kustomization.yaml is missing or empty";
  std::set<std::string> listed;
  for (const YAML::Node& r : pd.kustomization["resources"]) listed.insert(r.as<std::string>());
  EXPECT_EQ(listed.count("../kubernetes"), 1u) << "the overlay must build on deploy/kubernetes";
  for (const std::string& f : pd.files) EXPECT_EQ(listed.count(f), 1u) << f << " is not listed";
  // The one patch deletes the base's aggregated Deployment, by its real name and namespace.
  const Object* vllm = Manifests::Get().One("Deployment", kVllmFile);
  ASSERT_NE(vllm, nullptr);
  int deletes = 0;
  for (const YAML::Node& p : pd.kustomization["patches"]) {
    const YAML::Node patch = YAML::Load(p["patch"].as<std::string>(""));
    if (patch["$patch"].as<std::string>("") != "delete") continue;
    ++deletes;
    EXPECT_EQ(patch["kind"].as<std::string>(""), "Deployment");
    EXPECT_EQ(Dig(patch, "metadata", "name").as<std::string>(""), vllm->Name());
    EXPECT_EQ(Dig(patch, "metadata", "namespace").as<std::string>(""), vllm->Namespace());
  }
  EXPECT_EQ(deletes, 1);
}

TEST(DeployKubernetesPd, PrefillAndDecodePodsJoinThePoolWithTheirRoles) {
  const Manifests& pd = Pd();
  const Object* pool = Manifests::Get().Pool();
  ASSERT_NE(pool, nullptr);
  const auto selector = Labels(Dig(pool->node, "spec", "selector", "matchLabels"));
  const int target = PoolTargetPort();
  ASSERT_GT(target, 0);
  for (const auto& [file, role] : {std::pair<std::string, std::string>{"prefill-deployment.yaml", "prefill"},
                                   {"decode-deployment.yaml", "decode"}}) {
    const Object* d = pd.One("Deployment", file);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(d->Namespace(), pool->Namespace()) << d->Where();
    const auto labels = PodLabels(*d);
    EXPECT_TRUE(Selects(selector, labels)) << d->Where() << " " << Show(labels);
    EXPECT_EQ(labels.count("llm-d.ai/role") ? labels.at("llm-d.ai/role") : "", role) << d->Where();
    EXPECT_TRUE(Selects(Labels(Dig(d->node, "spec", "selector", "matchLabels")), labels)) << d->Where();
    const ContainerPorts ports = PortsOf(*d);
    EXPECT_EQ(ports.numbers.count(target), 1u) << "pool targetPort " << target << " is no port of " << d->Where();
    // vLLM with NixlConnector, its side channel on the pod IP.
    const YAML::Node v = Container(*d, "vllm");
    ASSERT_TRUE(v.IsMap()) << d->Where() << " has no vllm container";
    const CommandLine cmd = ParseArgs(ExpandedArgs(*d, v));
    const std::string kv = cmd.Value("--kv-transfer-config").value_or("");
    EXPECT_NE(kv.find("\"kv_connector\":\"NixlConnector\""), std::string::npos) << kv;
    EXPECT_TRUE(cmd.Value("--enable-prefix-caching").has_value()) << d->Where();
    bool side_channel = false;
    for (const YAML::Node& e : v["env"]) {
      side_channel = side_channel || (e["name"].as<std::string>("") == "VLLM_NIXL_SIDE_CHANNEL_HOST" &&
                                      Dig(e, "valueFrom", "fieldRef", "fieldPath").as<std::string>("") ==
                                          "status.podIP");
    }
    EXPECT_TRUE(side_channel) << d->Where();
    if (role == "prefill") {
      // Prefill pods serve the pool's port themselves.
      EXPECT_EQ(cmd.Value("--port").value_or(""), std::to_string(target)) << d->Where();
    }
  }
}

TEST(DeployKubernetesPd, TheDecodePodsSidecarFrontsItsVllmOnThePoolsPort) {
  const Object* d = Pd().One("Deployment", "decode-deployment.yaml");
  ASSERT_NE(d, nullptr);
  const YAML::Node sc = Container(*d, "sidecar");
  const YAML::Node v = Container(*d, "vllm");
  ASSERT_TRUE(sc.IsMap() && v.IsMap());
  EXPECT_EQ(Nth(sc["command"], 0).as<std::string>(""), "kvroute");
  const CommandLine side = ParseArgs(ExpandedArgs(*d, sc));
  EXPECT_EQ(side.subcommand, "sidecar");
  const CommandLine vllm = ParseArgs(ExpandedArgs(*d, v));
  EXPECT_EQ(side.Value("--port").value_or("8000"), std::to_string(PoolTargetPort()));
  EXPECT_EQ(side.Value("--vllm-port").value_or("8200"), vllm.Value("--port").value_or("8000"))
      << "the sidecar must reach the pod's own vLLM";
  EXPECT_NE(side.Value("--vllm-port").value_or("8200"), side.Value("--port").value_or("8000"));
  // Every flag is one `kvroute sidecar --help` lists.
  std::string help;
  const std::set<std::string> flags = HelpFlags("sidecar", &help);
  ASSERT_FALSE(flags.empty()) << help;
  EXPECT_EQ(UnknownFlags(side, flags), "") << help;
  // Ready when vLLM is (its /health through the sidecar on the pool's port).
  const ContainerPorts ports = PortsOf(*d);
  const YAML::Node probe = Dig(sc, "readinessProbe", "httpGet");
  EXPECT_EQ(probe["path"].as<std::string>(""), "/health");
  EXPECT_EQ(ResolvePort(probe["port"], ports), std::optional<int>(PoolTargetPort()));
  // Runs as the picker does: non-root, read-only root filesystem.
  EXPECT_TRUE(Dig(sc, "securityContext", "runAsNonRoot").as<bool>(false));
  EXPECT_TRUE(Dig(sc, "securityContext", "readOnlyRootFilesystem").as<bool>(false));
}


// ---------------------------------------------------------------------------------------
// The image (deploy/container/): the manifests run the image `make image` builds, as the
// user it was built with, and the image holds the libraries the binary loads.

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

fs::path ContainerDir() { return fs::path(kvroute::test_support::SourceDir()) / "deploy" / "container"; }

// "0.1.0" from CMakeLists.txt's project(kvroute VERSION 0.1.0 ...); "" when absent.
std::string ProjectVersion() {
  const std::string cmake = ReadFile(fs::path(kvroute::test_support::SourceDir()) / "CMakeLists.txt");
  std::smatch m;
  if (!std::regex_search(cmake, m, std::regex(R"(project\(kvroute VERSION ([0-9][0-9.]*))"))) return "";
  return m[1];
}

// The lines of the Dockerfile's runtime stage (after "FROM scratch AS runtime").
std::vector<std::string> RuntimeStage() {
  std::istringstream in(ReadFile(ContainerDir() / "Dockerfile"));
  std::vector<std::string> lines;
  bool on = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("FROM ", 0) == 0) {
      on = line == "FROM scratch AS runtime";
      continue;
    }
    if (on) lines.push_back(line);
  }
  return lines;
}

TEST(DeployImage, EveryKvrouteContainerRunsTheImageAsItsUser) {
  const std::string version = ProjectVersion();
  ASSERT_FALSE(version.empty()) << "CMakeLists.txt has no project(kvroute VERSION x.y.z)";
  const std::vector<std::string> stage = RuntimeStage();
  ASSERT_FALSE(stage.empty()) << "deploy/container/Dockerfile has no 'FROM scratch AS runtime' stage";
  EXPECT_EQ(std::count(stage.begin(), stage.end(), "ARG VERSION=" + version), 1)
      << "the Dockerfile's default VERSION is not CMakeLists.txt's";
  EXPECT_EQ(std::count(stage.begin(), stage.end(), "USER 65532:65532"), 1);
  EXPECT_EQ(std::count(stage.begin(), stage.end(), R"(ENTRYPOINT ["/usr/local/bin/kvroute"])"), 1);
  // The manifests start `kvroute` by name (command: [kvroute]), so the image's PATH must
  // hold /usr/local/bin.
  const bool path_ok = std::any_of(stage.begin(), stage.end(), [](const std::string& l) {
    return l.rfind("ENV PATH=", 0) == 0 && l.find("/usr/local/bin") != std::string::npos;
  });
  EXPECT_TRUE(path_ok) << "the runtime stage sets no PATH holding /usr/local/bin";

  int kvroute_containers = 0;
  for (const Manifests* m : {&Manifests::Get(), &Pd()}) {
    for (const Object& o : m->objects) {
      if (o.Kind() != "Deployment") continue;
      const YAML::Node pod_sc = Dig(PodSpec(o), "securityContext");
      for (const YAML::Node& c : PodSpec(o)["containers"]) {
        if (Nth(Dig(c, "command"), 0).as<std::string>("") != "kvroute") continue;
        ++kvroute_containers;
        const std::string where = o.Where() + " container " + c["name"].as<std::string>("");
        EXPECT_EQ(c["image"].as<std::string>(""), "kvroute:" + version) << where;
        for (const char* key : {"runAsUser", "runAsGroup"}) {
          const YAML::Node own = Dig(c, "securityContext", key);
          const int id = own.IsDefined() ? own.as<int>(-1) : Dig(pod_sc, key).as<int>(-1);
          EXPECT_EQ(id, 65532) << where << ": " << key;
        }
      }
    }
  }
  EXPECT_EQ(kvroute_containers, 3) << "the picker, the sim and the P/D sidecar";
}

// Every library the binary needs (readelf's NEEDED entries) is a file or symlink of the
// image's listing, rootfs-files.txt (which scripts/build-image.sh compares with the
// archive it builds): a new dependency must reach runtime-packages.txt.
TEST(DeployImage, TheImageHoldsEveryLibraryTheBinaryNeeds) {
  const auto [status, out] = RunProcess({"/usr/bin/readelf", "-d", Binary()});
  ASSERT_EQ(status, 0) << out;
  const std::string listing = ReadFile(ContainerDir() / "rootfs-files.txt");
  ASSERT_FALSE(listing.empty()) << "deploy/container/rootfs-files.txt is missing or empty";
  const std::regex needed(R"(\(NEEDED\)\s+Shared library: \[([^\]]+)\])");
  int count = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), needed); it != std::sregex_iterator(); ++it) {
    ++count;
    const std::string lib = (*it)[1];
    const bool listed = listing.find(" /usr/lib/x86_64-linux-gnu/" + lib + "\n") != std::string::npos ||
                        listing.find(" /usr/lib/x86_64-linux-gnu/" + lib + " -> ") != std::string::npos ||
                        listing.find(" /usr/lib64/" + lib + " -> ") != std::string::npos;
    EXPECT_TRUE(listed) << lib << " is not in deploy/container/rootfs-files.txt";
  }
  EXPECT_GE(count, 10) << out;
  EXPECT_NE(listing.find("f 0755 0:0 /usr/local/bin/kvroute\n"), std::string::npos);
  EXPECT_NE(listing.find("f 0644 0:0 /etc/passwd\n"), std::string::npos);
  // libssl's default verify paths (HTTPS upstreams, the Kubernetes API server's
  // certificate) lead to the CA bundle: OPENSSLDIR belongs to the openssl package, which
  // the image does not hold whole.
  for (const char* entry : {"l 0777 0:0 /usr/lib/ssl/cert.pem -> /etc/ssl/certs/ca-certificates.crt\n",
                            "l 0777 0:0 /usr/lib/ssl/certs -> /etc/ssl/certs\n",
                            "f 0644 0:0 /etc/ssl/certs/ca-certificates.crt\n"}) {
    EXPECT_NE(listing.find(entry), std::string::npos) << entry;
  }
  // No shell and no package manager: only what kvroute loads.
  for (const char* absent : {" /usr/bin/bash\n", " /usr/bin/dash\n", " /usr/bin/apt\n", " /usr/bin/dpkg\n"}) {
    EXPECT_EQ(listing.find(absent), std::string::npos) << absent;
  }
}

}  // namespace
