#include "workflow/machine.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "nam/fabric_store.h"
#include "nam/pool.h"
#include "nam/server.h"
#include "workflow/fpga_config.h"

namespace msaflow::workflow {
namespace {

// Kept identical to configs/machines/local.json (a test checks it).
constexpr char kLocalMachine[] = R"json({
  "name": "local",
  "launcher": "local",
  "modules": {
    "cm":  {"description": "Cluster Module: coordinator and model loading (local processes)", "max_ranks": 1},
    "esb": {"description": "Extreme Scale Booster: evaluation task farm (local MPI ranks, may outnumber the cores)", "max_ranks": 64},
    "dam": {"description": "Data Analytics Module: preparation, training, selection (FPGA simulated: OpenCL on PoCL when installed, else C++; local MPI ranks)",
            "max_ranks": 64, "fpga": "auto"}
  },
  "nam": {"serve": true, "listen": "127.0.0.1:0", "provider": "tcp", "capacity": "2GiB"}
})json";

}  // namespace

int64_t ParseSlurmTime(const std::string& t, const std::string& where) {
  if (t == "UNLIMITED" || t == "INFINITE" || t == "-1") return -1;
  auto bad = [&]() -> int64_t {
    Throw(ErrorKind::kInvalidInput, where + ": '" + t +
                                        "' is not a Slurm time (expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                                        "D-HH:MM:SS or UNLIMITED)");
  };
  auto num = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) bad();
    return std::stoll(s);
  };
  std::vector<std::string> parts;
  std::string rest = t;
  int64_t days = 0;
  bool has_days = false;
  if (size_t dash = rest.find('-'); dash != std::string::npos) {
    days = num(rest.substr(0, dash));
    rest = rest.substr(dash + 1);
    has_days = true;
  }
  size_t start = 0;
  for (;;) {
    size_t colon = rest.find(':', start);
    parts.push_back(rest.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() > 3) bad();
  std::vector<int64_t> v;
  v.reserve(parts.size());
  for (const auto& x : parts) v.push_back(num(x));
  int64_t secs = 0;
  if (has_days) {  // D-HH[:MM[:SS]]
    secs = days * 86400 + v[0] * 3600 + (v.size() > 1 ? v[1] * 60 : 0) + (v.size() > 2 ? v[2] : 0);
  } else if (v.size() == 1) {  // minutes
    secs = v[0] * 60;
  } else if (v.size() == 2) {  // MM:SS
    secs = v[0] * 60 + v[1];
  } else {  // HH:MM:SS
    secs = v[0] * 3600 + v[1] * 60 + v[2];
  }
  if (secs <= 0) bad();
  return secs;
}

const ModuleSpec& Machine::Module(const std::string& n, const std::string& where) const {
  auto it = modules.find(n);
  if (it == modules.end()) {
    std::string have;
    for (const auto& [k, _] : modules) have += (have.empty() ? "" : ", ") + k;
    Throw(ErrorKind::kInvalidInput, where + ": module '" + n + "' is not in machine '" + name + "' (has " + have + ")");
  }
  return it->second;
}

namespace {

using nlohmann::json;

[[noreturn]] void Bad(const std::string& origin, const std::string& ptr, const std::string& what) {
  Throw(ErrorKind::kInvalidInput, origin + ": " + ptr + ": " + what);
}

// /modules/<k>: one module (its job component under Slurm).
ModuleSpec ReadModule(const std::string& k, const json& v, const std::string& origin, const std::string& base_dir) {
  const std::string ptr = "/modules/" + k;
  if (!v.is_object()) Bad(origin, ptr, "expected an object {partition, nodes, max_ranks, time, ...}");
  for (const auto& [f, _] : v.items())
    if (f != "description" && f != "max_ranks" && f != "memory" && f != "fpga" && f != "partition" &&
        f != "constraint" && f != "gres" && f != "feature" && f != "nodes" && f != "time")
      Bad(origin, ptr + "/" + f,
          "unknown field (expected description, max_ranks, memory, fpga, partition, constraint, gres, feature, nodes, "
          "time)");
  if (k.empty() || k.size() > 32 || k.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
    Bad(origin, ptr, "a module name is 1 to 32 lower-case letters, digits or '_'");
  ModuleSpec s;
  s.name = k;
  s.description = v.value("description", "");
  s.max_ranks = v.value("max_ranks", 1);
  // 0 = as many as this machine has cores.
  if (s.max_ranks <= 0) s.max_ranks = std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (v.contains("memory")) {
    if (!v["memory"].is_string()) Bad(origin, ptr + "/memory", "expected a size such as \"64GiB\"");
    s.memory = nam::ParseSize(v["memory"].get<std::string>(), origin + ": " + ptr + "/memory");
  }
  if (v.contains("fpga")) s.fpga = workflow::FpgaConfigFromJson(v["fpga"], origin + ": " + ptr + "/fpga", base_dir);
  s.partition = v.value("partition", k);
  s.constraint = v.value("constraint", "");
  s.gres = v.value("gres", "");
  s.feature = v.value("feature", "");
  s.nodes = v.value("nodes", 1);
  s.time = v.value("time", "30");
  if (s.nodes < 1) Bad(origin, ptr + "/nodes", "expected at least 1");
  ParseSlurmTime(s.time, origin + ": " + ptr + "/time");
  for (const std::string* f : {&s.partition, &s.constraint, &s.gres, &s.time, &s.feature})
    if (f->find_first_of(" \t\n'\"$`\\;") != std::string::npos)
      Bad(origin, ptr, "'" + *f + "' has characters that do not belong in an #SBATCH option");
  return s;
}

// /nam: where the run's NAM is, or the server it starts.
NamSpec ReadNam(const json& n, const std::string& origin) {
  NamSpec nam;
  const std::string where = origin + ": /nam";
  if (!n.is_object())
    Throw(ErrorKind::kInvalidInput, where + ": expected an object {serve, uri, listen, provider, capacity, module}");
  for (const auto& [k, v] : n.items()) {
    if (k == "serve") {
      if (!v.is_boolean()) Throw(ErrorKind::kInvalidInput, where + "/serve: expected true or false");
      nam.serve = v;
    } else if (k == "listen" || k == "provider" || k == "capacity" || k == "uri" || k == "module") {
      if (!v.is_string()) Throw(ErrorKind::kInvalidInput, where + "/" + k + ": expected a string");
      (k == "listen"     ? nam.listen
       : k == "provider" ? nam.provider
       : k == "capacity" ? nam.capacity
       : k == "uri"      ? nam.uri
                         : nam.module) = v.get<std::string>();
    } else {
      Throw(ErrorKind::kInvalidInput,
            where + ": unknown field '" + k + "' (expected serve, uri, listen, provider, capacity, module)");
    }
  }
  nam::ParseSize(nam.capacity, where + "/capacity");
  std::string host, port;
  nam::SplitHostPort(nam.listen, where + "/listen", &host, &port);
  if (!nam.uri.empty()) {
    if (nam.serve) Throw(ErrorKind::kInvalidInput, where + ": give either uri (a running NAM server) or serve: true, not both");
    if (nam.uri.rfind("fabric://", 0) == 0) {
      try {
        nam::ParseFabricUri(nam.uri);
      } catch (const Error& e) {
        Throw(ErrorKind::kInvalidInput, where + "/uri: " + e.what());
      }
    } else if (nam.uri.rfind("file://", 0) != 0) {
      Throw(ErrorKind::kInvalidInput, where + "/uri: '" + nam.uri + "': expected fabric://host:port or file:///dir");
    }
  }
  return nam;
}

// /slurm: how rounds become jobs; checked against the modules (single mode).
SlurmSpec ReadSlurm(const json& sl, const std::map<std::string, ModuleSpec>& modules, const std::string& origin,
                    const std::string& base_dir) {
  SlurmSpec slurm;
  auto fail = [&](const std::string& ptr, const std::string& what) { Bad(origin, ptr, what); };
  if (!sl.is_object()) fail("/slurm", "expected an object {mode, fallback, partition, conf, poll_s, nodes_share_cores}");
  auto mode = [&](const json& v, const std::string& ptr) {
    const auto m = v.is_string() ? SlurmModeFromName(v.get<std::string>()) : std::nullopt;
    if (!m) Bad(origin, ptr, "expected \"hetjob\", \"chained\" or \"single\"");
    return *m;
  };
  for (const auto& [k, v] : sl.items()) {
    if (k == "mode") {
      slurm.mode = mode(v, "/slurm/mode");
    } else if (k == "fallback") {
      if (v.is_boolean()) {
        slurm.fallback = v.get<bool>() ? std::vector<SlurmMode>{SlurmMode::kChained} : std::vector<SlurmMode>{};
      } else if (v.is_array()) {
        slurm.fallback.clear();
        for (size_t i = 0; i < v.size(); ++i)
          slurm.fallback.push_back(mode(v[i], "/slurm/fallback/" + std::to_string(i)));
      } else {
        fail("/slurm/fallback", "expected true, false or a list of modes such as [\"chained\", \"single\"]");
      }
    } else if (k == "partition") {
      if (!v.is_string() || v.get<std::string>().empty() ||
          v.get<std::string>().find_first_of(" \t\n'\"$`\\;") != std::string::npos)
        fail("/slurm/partition", "expected a partition name");
      slurm.partition = v;
    } else if (k == "conf") {
      if (!v.is_string()) fail("/slurm/conf", "expected a path");
      std::filesystem::path p(v.get<std::string>());
      if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
      slurm.conf = p.lexically_normal().string();
    } else if (k == "poll_s") {
      if (!v.is_number() || v.get<double>() <= 0) fail("/slurm/poll_s", "expected seconds > 0");
      slurm.poll_s = v;
    } else if (k == "nodes_share_cores") {
      if (!v.is_boolean()) fail("/slurm/nodes_share_cores", "expected true or false");
      slurm.nodes_share_cores = v;
    } else {
      fail("/slurm", "unknown field '" + k + "' (expected mode, fallback, partition, conf, poll_s, nodes_share_cores)");
    }
  }
  const bool single = slurm.mode == SlurmMode::kSingle || std::find(slurm.fallback.begin(), slurm.fallback.end(),
                                                                    SlurmMode::kSingle) != slurm.fallback.end();
  if (single && slurm.partition.empty())
    fail("/slurm/partition", "the single mode needs the one partition that holds every module's nodes");
  // Single mode: every module's nodes are picked by feature, or none is.
  size_t with_feature = 0;
  for (const auto& [k, s] : modules) with_feature += !s.feature.empty();
  if (single && with_feature != 0 && with_feature != modules.size())
    fail("/modules", "in single mode either every module names its node feature or none does");
  return slurm;
}

}  // namespace

Machine ParseMachine(const std::string& text, const std::string& origin, const std::string& base_dir) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) Throw(ErrorKind::kInvalidInput, origin + ": not a JSON object");
  Machine m;
  std::string launcher;
  for (const auto& [k, v] : j.items())
    if (k != "name" && k != "launcher" && k != "modules" && k != "nam" && k != "slurm" && k != "description")
      Bad(origin, "/" + k, "unknown field (expected name, description, launcher, modules, nam, slurm)");
  try {
    m.name = j.at("name").get<std::string>();
    launcher = j.value("launcher", "local");
    if (!j.at("modules").is_object()) Bad(origin, "/modules", "expected an object {module: {partition, nodes, ...}}");
    for (const auto& [k, v] : j.at("modules").items()) m.modules[k] = ReadModule(k, v, origin, base_dir);
  } catch (const json::exception& e) {
    Throw(ErrorKind::kInvalidInput, origin + ": " + e.what());
  }
  if (j.contains("nam")) m.nam = ReadNam(j["nam"], origin);
  if (!ParseLauncherKind(launcher, &m.launcher))
    Bad(origin, "/launcher", "'" + launcher + "' is not a launcher (expected local or slurm)");
  if (j.contains("slurm")) m.slurm = ReadSlurm(j["slurm"], m.modules, origin, base_dir);
  if (m.OnThisHost()) {  // every module's processes run here: this host's memory, unless the file says less
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    for (auto& [_, mod] : m.modules)
      if (mod.memory == 0 && pages > 0 && page > 0)
        mod.memory = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  }
  if (!m.nam.module.empty()) {
    if (m.launcher != LauncherKind::kSlurm) Bad(origin, "/nam/module", "a NAM server on a module needs launcher slurm");
    if (!m.nam.serve) Bad(origin, "/nam/module", "only a server the run starts (serve: true) runs on a module");
    m.Module(m.nam.module, origin + ": /nam/module");
  }
  return m;
}

bool ParseLauncherKind(const std::string& name, LauncherKind* kind) {
  if (name == "local") {
    *kind = LauncherKind::kLocal;
    return true;
  }
  if (name == "slurm") {
    *kind = LauncherKind::kSlurm;
    return true;
  }
  return false;
}

const char* LauncherName(LauncherKind k) {
  switch (k) {
    case LauncherKind::kLocal: return "local";
    case LauncherKind::kSlurm: return "slurm";
  }
  return "?";
}

const char* SlurmModeName(SlurmMode m) {
  switch (m) {
    case SlurmMode::kHetjob:
      return "hetjob";
    case SlurmMode::kChained:
      return "chained";
    case SlurmMode::kSingle:
      return "single";
  }
  return "?";
}

std::optional<SlurmMode> SlurmModeFromName(std::string_view name) {
  return ByName(name, SlurmModeName, {SlurmMode::kHetjob, SlurmMode::kChained, SlurmMode::kSingle});
}

bool OnThisHost(LauncherKind k) {
  switch (k) {
    case LauncherKind::kLocal:
      return true;
    case LauncherKind::kSlurm:
      return false;
  }
  return false;
}

Machine LoadMachine(const std::string& name_or_path) {
  if (name_or_path == "local") {
    Machine m = ParseMachine(kLocalMachine, "<built-in machine local>", "");
    m.source = "local";
    return m;
  }
  std::string base = std::filesystem::absolute(name_or_path).parent_path().string();
  Machine m = ParseMachine(ReadInputFile(name_or_path, "a machine file (JSON)", 1 << 20), name_or_path, base);
  m.source = std::filesystem::absolute(name_or_path).lexically_normal().string();
  return m;
}

}  // namespace msaflow::workflow
