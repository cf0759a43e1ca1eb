// fabric://HOST:PORT[?provider=tcp|shm|...&transport=auto|rma|map&timeout=SECONDS&token-file=F]
// — the client of the NAM server. Control messages go over libfabric; object bytes move by
// RMA (fi_write / fi_read in pipelined chunks) or, when the client runs on the server's node
// and transport is auto or map, by copying through the server's pool mapped into this process.
//
// Every call is bounded: when the server stops answering or dies, the call throws
// kUnavailable after `timeout` seconds without progress (default 30, or MSAFLOW_NAM_TIMEOUT),
// never hangs. The next call connects afresh, so a restarted server is picked up.
// The token comes from token-file=, MSAFLOW_NAM_TOKEN_FILE or MSAFLOW_NAM_TOKEN.
#pragma once

#include <memory>
#include <mutex>

#include "nam/store.h"

namespace msaflow::nam {

struct FabricUri {
  std::string host, port;
  std::string provider = "tcp";
  std::string transport = "auto";
  double timeout_s = 30;
  std::string token_file;
};
// Throws kInvalidInput naming the URI and the part that is wrong.
FabricUri ParseFabricUri(const std::string& uri);

class FabricStore : public Store {
 public:
  explicit FabricStore(const std::string& uri);
  ~FabricStore() override;
  ObjectInfo Put(const std::string& name, std::string_view bytes, const nlohmann::json& meta) override;
  Object Get(const std::string& name) override;
  ObjectInfo GetInto(const std::string& name, std::string& bytes) override;
  std::optional<ObjectInfo> Stat(const std::string& name) override;
  std::vector<ObjectInfo> List(const std::string& prefix) override;
  bool Remove(const std::string& name) override;
  std::string Uri() const override { return uri_; }

  // The server's counters: capacity, used, objects, resident, pinned, sessions, ...
  nlohmann::json Capacity();
  // "map" or "rma": how object bytes moved on the last connection (for benchmarks and logs).
  std::string Transport();

  struct Conn;

 private:
  template <typename F>
  auto WithRetry(const char* what, F&& f);
  Conn& Connection();

  std::string uri_;
  FabricUri parsed_;
  std::mutex mu_;
  std::unique_ptr<Conn> conn_;
};

}  // namespace msaflow::nam
