#include "service/admission.h"

#include <fmt/format.h>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "orchestrator/validate.h"

namespace msaflow::service {

using nlohmann::json;

namespace {

constexpr char kOrigin[] = "pipeline";

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

bool SafeName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return s[0] != '.' && s[0] != '-';
}

// Every file the pipeline names must be in the user's folders.
void CheckConfined(const workflow::Pipeline& p, const User& user) {
  auto inside = [&](const std::string& path, const std::string& pointer) {
    if (path.empty()) return;
    // A missing file is named as missing only in a folder of the user's: whether a path
    // outside them exists is not the caller's to learn (it gets the 403 below either way).
    if (RealPath(path).empty() &&
        !InsideFolders(std::filesystem::path(path).parent_path().string(), user.allow).empty())
      throw ApiError(422, "invalid_pipeline", path + ": no such file or folder", pointer);
    if (InsideFolders(path, user.allow).empty())
      throw ApiError(403, "outside_your_folders",
                     path + " is not in your folders (" + (user.allow.empty() ? "you have none" : fmt::format("{}", fmt::join(user.allow, ", "))) + ")",
                     pointer, "name files under the folders the service's users file gives you");
  };
  auto split = [&](const workflow::SplitSpec& s, const std::string& at) {
    if (s.from_train()) return;
    if (s.format == "folder") {
      inside(s.root, at + "/root");
    } else {
      inside(s.images, at + "/images");
      inside(s.labels, at + "/labels");
    }
  };
  split(p.train, "/datasets/train");
  split(p.test, "/datasets/test");
  if (p.validation) split(*p.validation, "/datasets/validation");
  for (size_t i = 0; i < p.backbones.size(); ++i)
    if (p.backbones[i].kind == workflow::BackboneKind::kOnnx)
      inside(p.backbones[i].onnx, p.backbones[i].pointer + "/onnx");
  if (!p.nam.empty())
    throw ApiError(403, "nam_not_allowed", "a pipeline run by the service uses its user's own NAM store; it may not name one",
                   "/nam", "leave out \"nam\"");
}

}  // namespace

std::string InsideFolders(const std::string& path, const std::vector<std::string>& folders) {
  std::string real = RealPath(path);
  if (real.empty()) return "";
  for (const std::string& f : folders) {
    const std::string rf = RealPath(f);
    if (rf.empty()) continue;
    if (real == rf || (real.size() > rf.size() && real.compare(0, rf.size(), rf) == 0 && (rf == "/" || real[rf.size()] == '/')))
      return real;
  }
  return "";
}

ApiError InvalidPipeline(const std::string& what, const std::string& origin) {
  std::string rest = what;
  if (rest.rfind(origin + ": ", 0) == 0) rest = rest.substr(origin.size() + 2);
  std::string pointer;
  if (!rest.empty() && rest[0] == '/') {
    const size_t colon = rest.find(": ");
    if (colon != std::string::npos) {
      pointer = rest.substr(0, colon);
      rest = rest.substr(colon + 2);
    }
  }
  std::string hint;
  const std::string dash = " — ";
  if (const size_t at = rest.find(dash); at != std::string::npos) {
    hint = rest.substr(at + dash.size());
    rest = rest.substr(0, at);
  }
  return ApiError(422, "invalid_pipeline", rest, pointer, hint);
}

Admitted Admit(const std::string& body, const User& user, const std::string& service_machine,
               const std::string& user_runs_dir) {
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    throw ApiError(422, "invalid_pipeline", "the body is not a JSON object (expected a pipeline, or {\"pipeline\": ...})", "/");
  std::string text = body, machine, name;
  if (doc.contains("pipeline") && !doc.contains("format")) {  // the wrapped form
    for (const auto& [k, v] : doc.items()) {
      if (k != "pipeline" && k != "machine" && k != "name")
        throw ApiError(422, "invalid_request", "unknown key", "/" + k, "expected pipeline, machine, name");
      if (k != "pipeline" && !v.is_string()) throw ApiError(422, "invalid_request", "expected a string", "/" + k);
    }
    if (!doc["pipeline"].is_object()) throw ApiError(422, "invalid_request", "expected the pipeline, an object", "/pipeline");
    text = doc["pipeline"].dump();
    machine = doc.value("machine", "");
    name = doc.value("name", "");
    if (!name.empty() && !SafeName(name))
      throw ApiError(422, "invalid_request", "expected a run name of 1 to 64 letters, digits, _ - and .", "/name");
  }
  const std::string base = user.allow.empty() ? "/nonexistent" : user.allow.front();
  Admitted a;
  try {
    a.pipeline = workflow::ParsePipeline(text, kOrigin, base);
  } catch (const Error& e) {
    throw InvalidPipeline(e.what(), kOrigin);
  }
  CheckConfined(a.pipeline, user);
  // The machine: the service's, else the request's or the pipeline's: built in, or a file of the user's.
  if (!service_machine.empty()) {
    a.machine = service_machine;
  } else {
    machine = machine.empty() ? a.pipeline.machine : machine;
    if (machine == "local") {
      a.machine = "local";
    } else {
      const std::string abs = machine[0] == '/' ? machine : base + "/" + machine;
      a.machine = InsideFolders(abs, user.allow);
      if (a.machine.empty())
        throw ApiError(403, "outside_your_folders", "machine " + machine + " is not a file in your folders", "/machine");
    }
  }
  try {
    a.machine_spec = workflow::LoadMachine(a.machine);
    a.summary = orchestrator::CheckPipeline(a.pipeline, a.machine_spec, kOrigin, user_runs_dir);
  } catch (const Error& e) {
    throw InvalidPipeline(e.what(), kOrigin);
  }
  a.name = name.empty() ? a.pipeline.name : name;
  return a;
}

}  // namespace msaflow::service
