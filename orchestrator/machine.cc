#include "orchestrator/machine.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "nam/pool.h"
#include "nam/server.h"

namespace msaflow::orchestrator {
namespace {

// Kept identical to configs/machines/local.json (a test checks it).
constexpr char kLocalMachine[] = R"json({
  "name": "local",
  "launcher": "local",
  "modules": {
    "cm":  {"description": "Cluster Module: coordinator and model loading (local processes)", "max_ranks": 1},
    "esb": {"description": "Extreme Scale Booster: evaluation task farm (local processes)", "max_ranks": 0},
    "dam": {"description": "Data Analytics Module: preparation, training, selection (FPGA simulated on the CPU)",
            "max_ranks": 0, "fpga": "simulated"}
  },
  "nam": {"serve": true, "listen": "127.0.0.1:0", "provider": "tcp", "capacity": "2GiB"}
})json";

}  // namespace

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
  auto fail = [&](const std::string& ptr, const std::string& what) {
    Throw(ErrorKind::kInvalidInput, origin + ": " + ptr + ": " + what);
  };
  for (const auto& [k, v] : j.items())
    if (k != "name" && k != "launcher" && k != "modules" && k != "nam" && k != "slurm" && k != "description")
      fail("/" + k, "unknown field (expected name, description, launcher, modules, nam, slurm)");
  try {
    m.name = j.at("name").get<std::string>();
    m.launcher = j.value("launcher", "local");
    for (const auto& [k, v] : j.at("modules").items()) {
      ModuleSpec s;
      s.name = k;
      s.description = v.value("description", "");
      s.max_ranks = v.value("max_ranks", 1);
      // 0 = as many as this machine has cores.
      if (s.max_ranks <= 0) s.max_ranks = std::max<int64_t>(1, std::thread::hardware_concurrency());
      s.fpga = v.value("fpga", "");
      s.partition = v.value("partition", k);
      s.constraint = v.value("constraint", "");
      s.gres = v.value("gres", "");
      s.nodes = v.value("nodes", 1);
      s.time = v.value("time", "30");
      if (s.nodes < 1) fail("/modules/" + k + "/nodes", "expected at least 1");
      for (const std::string* f : {&s.partition, &s.constraint, &s.gres, &s.time})
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
    if (!n.is_object()) Throw(ErrorKind::kInvalidInput, where + ": expected an object {serve, listen, provider, capacity}");
    for (const auto& [k, v] : n.items()) {
      if (k == "serve") {
        if (!v.is_boolean()) Throw(ErrorKind::kInvalidInput, where + "/serve: expected true or false");
        m.nam.serve = v;
      } else if (k == "listen" || k == "provider" || k == "capacity") {
        if (!v.is_string()) Throw(ErrorKind::kInvalidInput, where + "/" + k + ": expected a string");
        (k == "listen" ? m.nam.listen : k == "provider" ? m.nam.provider : m.nam.capacity) = v.get<std::string>();
      } else {
        Throw(ErrorKind::kInvalidInput, where + ": unknown field '" + k + "' (expected serve, listen, provider, capacity)");
      }
    }
    nam::ParseSize(m.nam.capacity, where + "/capacity");
    std::string host, port;
    nam::SplitHostPort(m.nam.listen, where + "/listen", &host, &port);
  }
  if (m.launcher != "local" && m.launcher != "slurm")
    fail("/launcher", "'" + m.launcher + "' is not a launcher (expected local or slurm)");
  if (j.contains("slurm")) {
    const auto& sl = j["slurm"];
    if (!sl.is_object()) fail("/slurm", "expected an object {mode, fallback, conf, poll_s}");
    for (const auto& [k, v] : sl.items()) {
      if (k == "mode") {
        if (!v.is_string() || (v != "hetjob" && v != "chained")) fail("/slurm/mode", "expected \"hetjob\" or \"chained\"");
        m.slurm.mode = v;
      } else if (k == "fallback") {
        if (!v.is_boolean()) fail("/slurm/fallback", "expected true or false");
        m.slurm.fallback = v;
      } else if (k == "conf") {
        if (!v.is_string()) fail("/slurm/conf", "expected a path");
        std::filesystem::path p(v.get<std::string>());
        if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
        m.slurm.conf = p.lexically_normal().string();
      } else if (k == "poll_s") {
        if (!v.is_number() || v.get<double>() <= 0) fail("/slurm/poll_s", "expected seconds > 0");
        m.slurm.poll_s = v;
      } else {
        fail("/slurm", "unknown field '" + k + "' (expected mode, fallback, conf, poll_s)");
      }
    }
  }
  return m;
}

Machine LoadMachine(const std::string& name_or_path) {
  if (name_or_path == "local") return ParseMachine(kLocalMachine, "<built-in machine local>", "");
  std::string base = std::filesystem::absolute(name_or_path).parent_path().string();
  return ParseMachine(ReadFile(name_or_path), name_or_path, base);
}

}  // namespace msaflow::orchestrator
