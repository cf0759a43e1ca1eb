#include "service/users.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cctype>
#include <filesystem>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"

namespace msaflow::service {

using nlohmann::json;

namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

bool ValidUserName(std::string_view name) {
  if (name.empty() || name.size() > 32 || name[0] == '-') return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  return true;
}

const User* Users::Find(std::string_view name) const {
  for (const User& u : users)
    if (u.name == name) return &u;
  return nullptr;
}

const User* Users::Authenticate(std::string_view token) const {
  if (token.empty() || token.size() > 256) return nullptr;
  const std::string h = Sha256Hex(token);
  const User* found = nullptr;
  for (const User& u : users) {  // every hash compared, whichever matches
    const bool same = u.token_sha256.size() == h.size() && CRYPTO_memcmp(u.token_sha256.data(), h.data(), h.size()) == 0;
    if (same && !found) found = &u;
  }
  return found;
}

Users ParseUsers(const std::string& text, const std::string& origin) {
  json doc = json::parse(text, nullptr, false);
  auto fail = [&](const std::string& ptr, const std::string& msg) {
    Throw(ErrorKind::kInvalidInput, origin + ": " + ptr + ": " + msg);
  };
  if (doc.is_discarded() || !doc.is_object()) fail("/", "expected a JSON object {\"format\": \"msaflow.users/1\", \"users\": [...]}");
  if (doc.value("format", "") != kUsersFormat) fail("/format", std::string("expected \"") + kUsersFormat + "\"");
  if (!doc.contains("users") || !doc["users"].is_array()) fail("/users", "expected an array of users");
  Users u;
  for (size_t i = 0; i < doc["users"].size(); ++i) {
    const json& e = doc["users"][i];
    const std::string at = fmt::format("/users/{}", i);
    if (!e.is_object()) fail(at, "expected an object");
    for (const auto& [k, _] : e.items())
      if (k != "name" && k != "token_sha256" && k != "allow" && k != "max_running" && k != "account")
        fail(at + "/" + k, "unknown key (expected name, token_sha256, allow, max_running, account)");
    User user;
    if (!e.contains("name") || !e["name"].is_string() || !ValidUserName(e["name"].get<std::string>()))
      fail(at + "/name", "expected a user name of 1 to 32 characters a-z, 0-9, _ and -");
    user.name = e["name"].get<std::string>();
    if (u.Find(user.name)) fail(at + "/name", "user \"" + user.name + "\" is listed twice");
    if (!e.contains("token_sha256") || !e["token_sha256"].is_string() || !IsHex64(e["token_sha256"].get<std::string>()))
      fail(at + "/token_sha256", "expected the SHA-256 of the token, 64 lower-case hex digits");
    user.token_sha256 = e["token_sha256"].get<std::string>();
    if (e.contains("allow")) {
      if (!e["allow"].is_array()) fail(at + "/allow", "expected an array of absolute folders");
      for (size_t j = 0; j < e["allow"].size(); ++j) {
        const json& d = e["allow"][j];
        if (!d.is_string() || d.get<std::string>().empty() || d.get<std::string>()[0] != '/')
          fail(fmt::format("{}/allow/{}", at, j), "expected an absolute folder");
        user.allow.push_back(d.get<std::string>());
      }
    }
    if (e.contains("max_running")) {
      if (!e["max_running"].is_number_integer() || e["max_running"].get<int64_t>() < 0 || e["max_running"].get<int64_t>() > 10000)
        fail(at + "/max_running", "expected an integer in 0..10000 (0: no limit of their own)");
      user.max_running = e["max_running"].get<int64_t>();
    }
    if (e.contains("account")) {
      if (!e["account"].is_string() || e["account"].get<std::string>().size() > 64)
        fail(at + "/account", "expected a Slurm account name");
      for (char c : e["account"].get<std::string>())
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
          fail(at + "/account", "expected a Slurm account name (letters, digits, _ - .)");
      user.account = e["account"].get<std::string>();
    }
    u.users.push_back(std::move(user));
  }
  return u;
}

Users LoadUsers(const std::string& path) { return ParseUsers(ReadFile(path), path); }

void SaveUsers(const std::string& path, const Users& u) {
  json users = json::array();
  for (const User& e : u.users) {
    json j = {{"name", e.name}, {"token_sha256", e.token_sha256}, {"allow", e.allow}};
    if (e.max_running) j["max_running"] = e.max_running;
    if (!e.account.empty()) j["account"] = e.account;
    users.push_back(std::move(j));
  }
  const mode_t old = ::umask(077);  // the temporary file is born 0600, then renamed over
  try {
    WriteFileAtomic(path, json{{"format", kUsersFormat}, {"users", users}}.dump(2) + "\n");
  } catch (...) {
    ::umask(old);
    throw;
  }
  ::umask(old);
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

std::string NewToken() {
  unsigned char b[32];
  if (RAND_bytes(b, sizeof b) != 1) Throw(ErrorKind::kIo, "no random bytes for a token (OpenSSL RAND_bytes failed)");
  return Hex(b, sizeof b);
}

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr) != 1)
    Throw(ErrorKind::kInternal, "SHA-256 failed (OpenSSL EVP_Digest)");
  return Hex(md, n);
}

}  // namespace msaflow::service
