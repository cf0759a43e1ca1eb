// A thin owner of the libfabric objects one side of the NAM needs: fabric, domain, address
// vector, completion queue and one FI_EP_RDM endpoint with FI_MSG | FI_RMA. It hides
// nothing of libfabric's model; it closes everything in the right order and honours the
// memory-registration bits (mr_mode) the provider asks for.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace msaflow::nam::fabric {

// "tcp" -> "tcp;ofi_rxm", "verbs" -> "verbs;ofi_rxm"; "shm" and full names as given.
std::string ProviderName(const std::string& short_name);

// The shm provider has no ports: a server listening on "port" P takes this name.
std::string ShmName(const std::string& port);

// Every posted operation carries one of these (first member: libfabric may use it when the
// provider asks for FI_CONTEXT/FI_CONTEXT2).
struct OpContext {
  fi_context2 fctx;
  int kind = 0;   // owner-defined
  int index = 0;  // owner-defined
};

struct Completion {
  OpContext* ctx = nullptr;
  size_t len = 0;   // bytes received (receives)
  int err = 0;      // 0, or a positive libfabric error number
  std::string what; // the provider's text for an error
};

struct Registration {
  fid_mr* mr = nullptr;
  void* desc = nullptr;   // local descriptor (needed when the provider wants FI_MR_LOCAL)
  uint64_t key = 0;       // remote key
  uint64_t base = 0;      // the remote address of the region's first byte
};

class Endpoint {
 public:
  // A server endpoint binds `node`:`service` (shm: takes the name ShmName(service)).
  // A client endpoint binds an ephemeral address (for tcp on the interface that reaches
  // `node`). Throws kUnavailable naming the provider and libfabric's reason.
  static std::unique_ptr<Endpoint> Open(const std::string& provider, const std::string& node,
                                        const std::string& service, bool server);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  const std::string& provider() const { return provider_; }
  std::string Name() const;             // raw address bytes (fi_getname), for a peer's AV
  std::string PrintableName() const;    // fi_av_straddr of Name()
  // The address a client sends to: the server's, from `node`:`service`.
  std::string ResolveServer(const std::string& node, const std::string& service) const;
  fi_addr_t Insert(std::string_view raw_addr);  // throws kInvalidInput for a bad address
  void RemoveAddr(fi_addr_t a);

  bool needs_local_mr() const { return (mr_mode_ & FI_MR_LOCAL) != 0; }
  // Registers [buf, buf+len). access: FI_REMOTE_READ / FI_REMOTE_WRITE for regions peers
  // reach, FI_SEND|FI_RECV|FI_READ|FI_WRITE for local buffers.
  Registration Register(void* buf, size_t len, uint64_t access);
  static void Deregister(Registration& r);

  // Each returns 0, -FI_EAGAIN (queue full: progress and retry) or another negative error.
  ssize_t PostRecv(void* buf, size_t len, void* desc, OpContext* ctx);
  ssize_t PostSend(const void* buf, size_t len, void* desc, fi_addr_t dest, OpContext* ctx);
  ssize_t PostWrite(const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t addr, uint64_t key,
                    OpContext* ctx);
  ssize_t PostRead(void* buf, size_t len, void* desc, fi_addr_t src, uint64_t addr, uint64_t key, OpContext* ctx);

  // Up to `max` completions. timeout_ms < 0: only poll; otherwise wait up to that long for
  // the first one (also drives the provider's manual progress). Returns the count.
  int Poll(Completion* out, int max, int timeout_ms);

 private:
  Endpoint() = default;
  std::string provider_;
  uint64_t mr_mode_ = 0;
  bool can_wait_ = false;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
};

// libfabric's text for a (positive or negative) error number.
std::string FabricError(ssize_t rc);

// Opens libfabric now rather than at the first fabric call (nam/fabric_library.cc). A process
// that handles SIGTERM or SIGINT itself and will reach the NAM over the fabric calls it before
// it installs its handlers: the PSM libraries' constructors replace those handlers while the
// library loads, and a stop signal in that moment would end the process their way (exit(),
// with nothing journalled). Throws as the first fabric call would.
void LoadLibrary();

}  // namespace msaflow::nam::fabric
