#include "workflow/fpga_config.h"

#include <filesystem>

#include "common/error.h"

namespace msaflow::workflow {
namespace {

using nlohmann::json;

[[noreturn]] void Bad(const std::string& where, const std::string& what) {
  Throw(ErrorKind::kInvalidInput, where + ": " + what);
}

kernels::fpga::Backend Backend(const json& v, const std::string& where) {
  if (!v.is_string()) Bad(where, "expected \"cpu\", \"opencl\" or \"auto\", got " + std::string(v.type_name()));
  std::string b = v.get<std::string>();
  if (b == "simulated") return kernels::fpga::Backend::kAuto;
  auto parsed = kernels::fpga::BackendFromName(b);
  if (!parsed) Bad(where, "\"" + b.substr(0, 40) + "\" is not one of cpu, opencl, auto");
  return *parsed;
}

double Positive(const json& t, const char* key, double hi, const std::string& where) {
  if (!t.contains(key)) Bad(where, std::string("missing \"") + key + "\"");
  const json& v = t[key];
  if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() <= hi))
    Bad(where + "/" + key, "expected a number in (0, " + std::to_string(static_cast<int64_t>(hi)) + "]");
  return v.get<double>();
}

}  // namespace

kernels::fpga::Config FpgaConfigFromJson(const json& v, const std::string& where, const std::string& base_dir) {
  kernels::fpga::Config c;
  if (v.is_string()) {
    c.backend = Backend(v, where);
    return c;
  }
  if (!v.is_object()) Bad(where, "expected a backend (\"cpu\", \"opencl\", \"auto\") or an object {backend, platform, binary, target}");
  for (const auto& [k, _] : v.items())
    if (k != "backend" && k != "platform" && k != "binary" && k != "source" && k != "target")
      Bad(where + "/" + k, "unknown field (expected backend, platform, binary, source, target)");
  if (!v.contains("backend")) Bad(where, "missing \"backend\" (cpu, opencl or auto)");
  c.backend = Backend(v["backend"], where + "/backend");
  for (auto [key, dst] : {std::pair{"platform", &c.platform}, std::pair{"binary", &c.binary}, std::pair{"source", &c.source}}) {
    if (!v.contains(key)) continue;
    if (!v[key].is_string() || v[key].get<std::string>().empty() || v[key].get<std::string>().size() > 4096)
      Bad(where + "/" + key, "expected a non-empty string");
    *dst = v[key].get<std::string>();
  }
  if (!c.binary.empty() && !c.source.empty()) Bad(where, "give \"binary\" or \"source\", not both");
  for (std::string* path : {&c.binary, &c.source}) {
    if (path->empty()) continue;
    std::filesystem::path p(*path);
    if (p.is_relative()) p = std::filesystem::path(base_dir) / p;
    *path = p.lexically_normal().string();
  }
  if (v.contains("target")) {
    const json& t = v["target"];
    const std::string tw = where + "/target";
    if (!t.is_object()) Bad(tw, "expected an object {name, clock_mhz, lanes, memory_gbs}");
    for (const auto& [k, _] : t.items())
      if (k != "name" && k != "clock_mhz" && k != "lanes" && k != "memory_gbs")
        Bad(tw + "/" + k, "unknown field (expected name, clock_mhz, lanes, memory_gbs)");
    if (t.contains("name")) {
      if (!t["name"].is_string() || t["name"].get<std::string>().size() > 200) Bad(tw + "/name", "expected a string");
      c.target.name = t["name"].get<std::string>();
    }
    c.target.clock_mhz = Positive(t, "clock_mhz", 1e5, tw);
    c.target.lanes = Positive(t, "lanes", 1e6, tw);
    c.target.memory_gbs = Positive(t, "memory_gbs", 1e5, tw);
  }
  return c;
}

json FpgaConfigToJson(const kernels::fpga::Config& c) {
  json j = {{"backend", kernels::fpga::BackendName(c.backend)}};
  if (!c.platform.empty()) j["platform"] = c.platform;
  if (!c.binary.empty()) j["binary"] = c.binary;
  if (!c.source.empty()) j["source"] = c.source;
  if (c.target.given())
    j["target"] = {{"name", c.target.name},
                   {"clock_mhz", c.target.clock_mhz},
                   {"lanes", c.target.lanes},
                   {"memory_gbs", c.target.memory_gbs}};
  return j;
}

}  // namespace msaflow::workflow
