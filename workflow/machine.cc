#include "workflow/machine.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/files.h"
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

Machine ParseMachine(const std::string& text, const std::string& origin, const std::string& base_dir) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) Throw(ErrorKind::kInvalidInput, origin + ": not a JSON object");
  Machine m;
  std::string launcher;
  auto fail = [&](const std::string& ptr, const std::string& what) {
    Throw(ErrorKind::kInvalidInput, origin + ": " + ptr + ": " + what);
  };
  for (const auto& [k, v] : j.items())
    if (k != "name" && k != "launcher" && k != "modules" && k != "nam" && k != "slurm" && k != "description")
      fail("/" + k, "unknown field (expected name, description, launcher, modules, nam, slurm)");
  try {
    m.name = j.at("name").get<std::string>();
    launcher = j.value("launcher", "local");
    if (!j.at("modules").is_object()) fail("/modules", "expected an object {module: {partition, nodes, ...}}");
    for (const auto& [k, v] : j.at("modules").items()) {
      if (!v.is_object()) fail("/modules/" + k, "expected an object {partition, nodes, max_ranks, time, ...}");
      for (const auto& [f, _] : v.items())
        if (f != "description" && f != "max_ranks" && f != "fpga" && f != "partition" && f != "constraint" &&
            f != "gres" && f != "feature" && f != "nodes" && f != "time")
          fail("/modules/" + k + "/" + f,
               "unknown field (expected description, max_ranks, fpga, partition, constraint, gres, feature, nodes, "
               "time)");
      if (k.empty() || k.size() > 32 || k.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
        fail("/modules/" + k, "a module name is 1 to 32 lower-case letters, digits or '_'");
      ModuleSpec s;
      s.name = k;
      s.description = v.value("description", "");
      s.max_ranks = v.value("max_ranks", 1);
      // 0 = as many as this machine has cores.
      if (s.max_ranks <= 0) s.max_ranks = std::max<int64_t>(1, std::thread::hardware_concurrency());
      if (v.contains("fpga")) s.fpga = workflow::FpgaConfigFromJson(v["fpga"], origin + ": /modules/" + k + "/fpga", base_dir);
      s.partition = v.value("partition", k);
      s.constraint = v.value("constraint", "");
      s.gres = v.value("gres", "");
      s.feature = v.value("feature", "");
      s.nodes = v.value("nodes", 1);
      s.time = v.value("time", "30");
      if (s.nodes < 1) fail("/modules/" + k + "/nodes", "expected at least 1");
      ParseSlurmTime(s.time, origin + ": /modules/" + k + "/time");
      for (const std::string* f : {&s.partition, &s.constraint, &s.gres, &s.time, &s.feature})
        if (f->find_first_of(" \t\n'\"$`\\;") != std::string::npos)
          fail("/modules/" + k, "'" + *f + "' has characters that do not belong in an #SBATCH option");
      m.modules[k] = s;
    }
  } catch (const nlohmann::json::exception& e) {
    Throw(ErrorKind::kInvalidInput, origin + ": " + e.what());
  }
  if (j.contains("nam")) {
    const auto& n = j["nam"];
    auto where = origin + ": /nam";
    if (!n.is_object())
      Throw(ErrorKind::kInvalidInput, where + ": expected an object {serve, uri, listen, provider, capacity, module}");
    for (const auto& [k, v] : n.items()) {
      if (k == "serve") {
        if (!v.is_boolean()) Throw(ErrorKind::kInvalidInput, where + "/serve: expected true or false");
        m.nam.serve = v;
      } else if (k == "listen" || k == "provider" || k == "capacity" || k == "uri" || k == "module") {
        if (!v.is_string()) Throw(ErrorKind::kInvalidInput, where + "/" + k + ": expected a string");
        (k == "listen"     ? m.nam.listen
         : k == "provider" ? m.nam.provider
         : k == "capacity" ? m.nam.capacity
         : k == "uri"      ? m.nam.uri
                           : m.nam.module) = v.get<std::string>();
      } else {
        Throw(ErrorKind::kInvalidInput,
              where + ": unknown field '" + k + "' (expected serve, uri, listen, provider, capacity, module)");
      }
    }
    nam::ParseSize(m.nam.capacity, where + "/capacity");
    std::string host, port;
    nam::SplitHostPort(m.nam.listen, where + "/listen", &host, &port);
    if (!m.nam.uri.empty()) {
      if (m.nam.serve) Throw(ErrorKind::kInvalidInput, where + ": give either uri (a running NAM server) or serve: true, not both");
      if (m.nam.uri.rfind("fabric://", 0) == 0) {
        try {
          nam::ParseFabricUri(m.nam.uri);
        } catch (const Error& e) {
          Throw(ErrorKind::kInvalidInput, where + "/uri: " + e.what());
        }
      } else if (m.nam.uri.rfind("file://", 0) != 0) {
        Throw(ErrorKind::kInvalidInput, where + "/uri: '" + m.nam.uri + "': expected fabric://host:port or file:///dir");
      }
    }
  }
  if (!ParseLauncherKind(launcher, &m.launcher))
    fail("/launcher", "'" + launcher + "' is not a launcher (expected local or slurm)");
  if (j.contains("slurm")) {
    const auto& sl = j["slurm"];
    if (!sl.is_object()) fail("/slurm", "expected an object {mode, fallback, partition, conf, poll_s}");
    auto is_mode = [](const nlohmann::json& v) {
      return v.is_string() && (v == "hetjob" || v == "chained" || v == "single");
    };
    for (const auto& [k, v] : sl.items()) {
      if (k == "mode") {
        if (!is_mode(v)) fail("/slurm/mode", "expected \"hetjob\", \"chained\" or \"single\"");
        m.slurm.mode = v;
      } else if (k == "fallback") {
        if (v.is_boolean()) {
          m.slurm.fallback = v.get<bool>() ? std::vector<std::string>{"chained"} : std::vector<std::string>{};
        } else if (v.is_array()) {
          m.slurm.fallback.clear();
          for (size_t i = 0; i < v.size(); ++i) {
            if (!is_mode(v[i]))
              fail("/slurm/fallback/" + std::to_string(i), "expected \"hetjob\", \"chained\" or \"single\"");
            m.slurm.fallback.push_back(v[i]);
          }
        } else {
          fail("/slurm/fallback", "expected true, false or a list of modes such as [\"chained\", \"single\"]");
        }
      } else if (k == "partition") {
        if (!v.is_string() || v.get<std::string>().empty() ||
            v.get<std::string>().find_first_of(" \t\n'\"$`\\;") != std::string::npos)
          fail("/slurm/partition", "expected a partition name");
        m.slurm.partition = v;
      } else if (k == "conf") {
        if (!v.is_string()) fail("/slurm/conf", "expected a path");
        std::filesystem::path p(v.get<std::string>());
        if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
        m.slurm.conf = p.lexically_normal().string();
      } else if (k == "poll_s") {
        if (!v.is_number() || v.get<double>() <= 0) fail("/slurm/poll_s", "expected seconds > 0");
        m.slurm.poll_s = v;
      } else {
        fail("/slurm", "unknown field '" + k + "' (expected mode, fallback, partition, conf, poll_s)");
      }
    }
    bool single = m.slurm.mode == "single" ||
                  std::find(m.slurm.fallback.begin(), m.slurm.fallback.end(), "single") != m.slurm.fallback.end();
    if (single && m.slurm.partition.empty())
      fail("/slurm/partition", "the single mode needs the one partition that holds every module's nodes");
    // Single mode: every module's nodes are picked by feature, or none is.
    size_t with_feature = 0;
    for (const auto& [k, s] : m.modules) with_feature += !s.feature.empty();
    if (single && with_feature != 0 && with_feature != m.modules.size())
      fail("/modules", "in single mode either every module names its node feature or none does");
  }
  if (!m.nam.module.empty()) {
    if (m.launcher != LauncherKind::kSlurm) fail("/nam/module", "a NAM server on a module needs launcher slurm");
    if (!m.nam.serve) fail("/nam/module", "only a server the run starts (serve: true) runs on a module");
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

Machine LoadMachine(const std::string& name_or_path) {
  if (name_or_path == "local") {
    Machine m = ParseMachine(kLocalMachine, "<built-in machine local>", "");
    m.source = "local";
    return m;
  }
  std::string base = std::filesystem::absolute(name_or_path).parent_path().string();
  Machine m = ParseMachine(ReadFile(name_or_path), name_or_path, base);
  m.source = std::filesystem::absolute(name_or_path).lexically_normal().string();
  return m;
}

}  // namespace msaflow::workflow
