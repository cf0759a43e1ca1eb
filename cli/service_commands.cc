// The service: `msaflow serve` and `msaflow users add|remove|list` (its users file). The
// service itself is service/http_server.h; this file binds options to it and prints.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/cli.h"
#include "common/files.h"
#include "service/http_server.h"
#include "service/users.h"

namespace msaflow::cli {

namespace {

service::Users UsersOrEmpty(const std::string& path) {
  if (!PathExists(path)) return {};
  return service::LoadUsers(path);
}

}  // namespace

int Serve(Options& o) {
  service::ServeOptions s = o.serve;
  if (s.users_file.empty()) Throw(ErrorKind::kInvalidInput, "serve: --users FILE is required (`msaflow users add` makes one)");
  s.runs_dir = std::filesystem::absolute(o.runs_dir).lexically_normal().string();
  s.msaflow_exe = SelfExe();
  if (!s.machine.empty() && s.machine != "local") s.machine = std::filesystem::absolute(s.machine).lexically_normal().string();
  if (s.max_running < 1 || s.max_running > 10000)
    Throw(ErrorKind::kInvalidInput, "serve: --max-running: expected 1..10000");
  for (const std::string& m : o.serve_models) {  // NAME=PATH
    const size_t eq = m.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == m.size())
      Throw(ErrorKind::kInvalidInput, "serve: --model " + m + ": expected NAME=PATH (a run directory or an exported .onnx)");
    const std::string name = m.substr(0, eq);
    if (s.models.count(name)) Throw(ErrorKind::kInvalidInput, "serve: --model " + name + " is given twice");
    s.models[name] = std::filesystem::absolute(m.substr(eq + 1)).lexically_normal().string();
  }
  if (s.max_batch < 1 || s.max_batch > 4096) Throw(ErrorKind::kInvalidInput, "serve: --max-batch: expected 1..4096");
  if (!(s.max_delay_ms >= 0 && s.max_delay_ms <= 1000))
    Throw(ErrorKind::kInvalidInput, "serve: --max-delay-ms: expected 0..1000");
  s.max_queue = std::max(s.max_queue, 16 * s.max_batch);
  service::LoadUsers(s.users_file);  // a bad users file is said now, not at the first request
  if (!s.machine.empty()) workflow::LoadMachine(s.machine);
  return service::Serve(s);
}

int UsersAdd(Options& o) {
  if (!service::ValidUserName(o.user_name))
    Throw(ErrorKind::kInvalidInput, "users add: \"" + o.user_name + "\" is not a user name (1 to 32 of a-z, 0-9, _ and -)");
  service::Users u = UsersOrEmpty(o.users_file);
  if (u.Find(o.user_name)) Throw(ErrorKind::kInvalidInput, "users add: " + o.users_file + " has a user \"" + o.user_name + "\" already (`msaflow users remove` first)");
  service::User user;
  user.name = o.user_name;
  for (const std::string& d : o.user_allow) {
    char buf[PATH_MAX];
    if (!::realpath(d.c_str(), buf) || !std::filesystem::is_directory(buf))
      Throw(ErrorKind::kNotFound, "users add: --allow " + d + ": no such folder");
    user.allow.emplace_back(buf);
  }
  user.max_running = o.user_max_running;
  user.account = o.user_account;
  const std::string token = service::NewToken();
  user.token_sha256 = service::Sha256Hex(token);
  u.users.push_back(user);
  service::SaveUsers(o.users_file, u);
  // Round-trip: what was written must read back (an account with a bad character is refused here).
  service::LoadUsers(o.users_file);
  std::printf("added user %s to %s (%zu folder%s); their token, shown this once:\n%s\n", user.name.c_str(),
              o.users_file.c_str(), user.allow.size(), user.allow.size() == 1 ? "" : "s", token.c_str());
  return 0;
}

int UsersRemove(Options& o) {
  service::Users u = service::LoadUsers(o.users_file);
  const size_t before = u.users.size();
  std::erase_if(u.users, [&](const service::User& x) { return x.name == o.user_name; });
  if (u.users.size() == before) Throw(ErrorKind::kNotFound, "users remove: " + o.users_file + " has no user \"" + o.user_name + "\"");
  service::SaveUsers(o.users_file, u);
  std::printf("removed user %s from %s (their runs are kept)\n", o.user_name.c_str(), o.users_file.c_str());
  return 0;
}

int UsersList(Options& o) {
  const service::Users u = service::LoadUsers(o.users_file);
  std::printf("%-16s %-11s %-12s %s\n", "user", "max_running", "account", "folders");
  for (const auto& x : u.users) {
    std::string folders;
    for (const auto& d : x.allow) folders += (folders.empty() ? "" : ", ") + d;
    std::printf("%-16s %-11lld %-12s %s\n", x.name.c_str(), static_cast<long long>(x.max_running),
                x.account.empty() ? "-" : x.account.c_str(), folders.empty() ? "-" : folders.c_str());
  }
  return 0;
}

}  // namespace msaflow::cli
