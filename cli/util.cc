#include <fmt/core.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/cli.h"

namespace msaflow::cli {

int ExitCode(ErrorKind k) {
  switch (k) {
    case ErrorKind::kTaskFailed: return 1;
    case ErrorKind::kInvalidInput: return 3;
    case ErrorKind::kNotFound: return 4;
    case ErrorKind::kCorrupt: return 5;
    case ErrorKind::kUnsupported: return 6;
    case ErrorKind::kIo: return 7;
    case ErrorKind::kUnavailable: return 8;
    case ErrorKind::kCapacity: return 9;
    case ErrorKind::kInternal: return 70;
  }
  return 70;
}

std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) Throw(ErrorKind::kIo, "cannot resolve /proc/self/exe: " + ec.message());
  return p.string();
}

// "a,b,c" -> {"a", "b", "c"}; an empty item is a usage error naming the option.
std::vector<std::string> SplitList(const std::string& s, const std::string& option) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    if (item.empty()) Throw(ErrorKind::kInvalidInput, option + ": \"" + s + "\" has an empty item");
    out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::string NamUri(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("MSAFLOW_NAM"); e && *e) return e;
  Throw(ErrorKind::kInvalidInput, "no NAM given: pass --nam URI (fabric://HOST:PORT, file://DIR) or set MSAFLOW_NAM");
}

void PrintInfo(const nam::ObjectInfo& i) {
  nlohmann::json j = {{"name", i.name}, {"size", i.size}, {"checksum", i.checksum}, {"version", i.version}, {"meta", i.meta}};
  std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace msaflow::cli
