// The service's users file (docs/service.md): who may call `msaflow serve`, by the SHA-256 of a
// bearer token (the token itself is shown once, by `msaflow users add`, and stored nowhere),
// with the folders whose files their pipelines may name, how many runs they may have running,
// and the Slurm account their jobs are charged to.
//   {"format": "msaflow.users/1",
//    "users": [{"name": "ana", "token_sha256": "<64 hex>", "allow": ["/data/ana"],
//               "max_running": 2, "account": "proj1"}]}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace msaflow::service {

inline constexpr char kUsersFormat[] = "msaflow.users/1";

struct User {
  std::string name;          // [a-z0-9_-]{1,32}: also the name of the user's folder of runs
  std::string token_sha256;  // 64 lower-case hex digits
  std::vector<std::string> allow;  // absolute folders (their real paths when added)
  int64_t max_running = 0;   // 0: only the service's --max-running bounds them
  std::string account;       // Slurm account for every job their runs cause; "" = Slurm's default
};

struct Users {
  std::vector<User> users;
  const User* Find(std::string_view name) const;
  // The user whose token this is, or null. Hashes the token once and compares it with every
  // user's hash in constant time, so neither the time nor the order says which hash was near.
  const User* Authenticate(std::string_view token) const;
};

// Throws kNotFound, or kInvalidInput "<path>: /users/1/allow/0: ..." naming the entry.
Users LoadUsers(const std::string& path);
Users ParseUsers(const std::string& text, const std::string& origin);
// Writes atomically, readable by its owner only (0600).
void SaveUsers(const std::string& path, const Users& u);

// A new token: 32 random bytes from the kernel, as 64 hex digits.
std::string NewToken();
std::string Sha256Hex(std::string_view data);
// Whether `name` can name a user ([a-z0-9_-]{1,32}, not starting with '-').
bool ValidUserName(std::string_view name);

}  // namespace msaflow::service
