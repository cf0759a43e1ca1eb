#include "nam/fabric.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <stdlib.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include "common/error.h"

namespace msaflow::nam::fabric {
namespace {

constexpr uint32_t kApiVersion = FI_VERSION(1, 17);

std::atomic<uint64_t> g_next_key{1};

bool IsShm(const std::string& prov) { return prov == "shm"; }

// ofi_rxm posts msg_rx_size receive buffers of ~16 KiB on each connection's message endpoint,
// 1,024 by default: 17 MB zeroed per endpoint, 0.17 s of every module process's start here
// (first touches of fresh pages are slow on a VM), and as much again on the server per client.
// The NAM's messages are small requests and replies (data moves by RMA), so 128 are plenty.
// Set before main (no thread yet); a value the user set is kept.
[[maybe_unused]] const bool kRxmDefaults = [] {
  ::setenv("FI_OFI_RXM_MSG_RX_SIZE", "128", 0);
  return true;
}();

}  // namespace

std::string FabricError(ssize_t rc) {
  int e = static_cast<int>(rc < 0 ? -rc : rc);
  return fi_strerror(e);
}

std::string ProviderName(const std::string& short_name) {
  if (short_name == "tcp") return "tcp;ofi_rxm";
  if (short_name == "verbs") return "verbs;ofi_rxm";
  if (short_name == "net") return "net;ofi_rxm";
  return short_name;
}

std::string ShmName(const std::string& port) { return "msaflow-nam-" + port; }

std::unique_ptr<Endpoint> Endpoint::Open(const std::string& provider, const std::string& node,
                                         const std::string& service, bool server) {
  std::unique_ptr<Endpoint> e(new Endpoint());
  e->provider_ = ProviderName(provider);
  // A server's errors name the address it was to listen on ("Address already in use" of
  // which port?); a client's name the server it was to reach.
  const std::string where = (server ? "listening on " : "reaching ") + node + ":" + service;
  auto fail = [&](const std::string& what, ssize_t rc) {
    Throw(ErrorKind::kUnavailable,
          "libfabric provider '" + e->provider_ + "', " + where + ": " + what + ": " + FabricError(rc));
  };
  fi_info* hints = fi_allocinfo();
  if (!hints) Throw(ErrorKind::kInternal, "fi_allocinfo failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->fabric_attr->prov_name = strdup(e->provider_.c_str());
  const bool shm = IsShm(e->provider_);
  // tcp binds the first interface by default; a server binds exactly node:service.
  const char* gnode = nullptr;
  const char* gservice = nullptr;
  uint64_t flags = 0;
  if (server && !shm) {
    gnode = node.c_str();
    gservice = service.c_str();
    flags = FI_SOURCE;
  } else if (!server && !shm) {
    gnode = node.c_str();  // picks the interface that reaches the server
    gservice = service.c_str();
  }
  // RMA writes complete only once the data is in the target's memory, so a COMMIT that
  // follows them sees all of it (the server checks the checksum anyway).
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  int rc = fi_getinfo(kApiVersion, gnode, gservice, flags, hints, &e->info_);
  if (rc == -FI_ENODATA) {
    hints->tx_attr->op_flags = 0;
    rc = fi_getinfo(kApiVersion, gnode, gservice, flags, hints, &e->info_);
  }
  fi_freeinfo(hints);
  if (rc != 0) fail("no endpoint for " + node + ":" + service + " with FI_EP_RDM, FI_MSG and FI_RMA", rc);
  fi_info* info = e->info_;
  e->mr_mode_ = info->domain_attr->mr_mode;
  if (!server && !shm && info->dest_addr) {
    // The client endpoint itself must not bind the server's port.
    std::free(info->dest_addr);
    info->dest_addr = nullptr;
    info->dest_addrlen = 0;
  }
  if ((rc = fi_fabric(info->fabric_attr, &e->fabric_, nullptr))) fail("fi_fabric", rc);
  if ((rc = fi_domain(e->fabric_, info, &e->domain_, nullptr))) fail("fi_domain", rc);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = 0;
  // Blocking reads (fi_cq_sread) sleep in epoll on the rxm/tcp sockets. shm's only wait
  // object spins in sched_yield and ignores the timeout, so shm polls with a backoff instead.
  cq_attr.wait_obj = shm ? FI_WAIT_NONE : FI_WAIT_UNSPEC;
  if (!shm && fi_cq_open(e->domain_, &cq_attr, &e->cq_, nullptr) == 0) {
    e->can_wait_ = true;
  } else {
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((rc = fi_cq_open(e->domain_, &cq_attr, &e->cq_, nullptr))) fail("fi_cq_open", rc);
  }
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  if ((rc = fi_av_open(e->domain_, &av_attr, &e->av_, nullptr))) fail("fi_av_open", rc);
  if ((rc = fi_endpoint(e->domain_, info, &e->ep_, nullptr))) fail("fi_endpoint", rc);
  if ((rc = fi_ep_bind(e->ep_, &e->av_->fid, 0))) fail("fi_ep_bind(av)", rc);
  if ((rc = fi_ep_bind(e->ep_, &e->cq_->fid, FI_TRANSMIT | FI_RECV))) fail("fi_ep_bind(cq)", rc);
  if (server && shm) {
    std::string name = ShmName(service);
    if ((rc = fi_setname(&e->ep_->fid, name.data(), name.size() + 1))) fail("fi_setname " + name, rc);
  }
  if ((rc = fi_enable(e->ep_))) fail("fi_enable", rc);
  return e;
}

Endpoint::~Endpoint() {
  if (ep_) fi_close(&ep_->fid);
  if (av_) fi_close(&av_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) fi_freeinfo(info_);
}

std::string Endpoint::Name() const {
  char buf[256];
  size_t len = sizeof buf;
  int rc = fi_getname(&ep_->fid, buf, &len);
  if (rc) Throw(ErrorKind::kInternal, "fi_getname: " + FabricError(rc));
  return std::string(buf, len);
}

std::string Endpoint::PrintableName() const {
  std::string raw = Name();
  char buf[256];
  size_t len = sizeof buf;
  fi_av_straddr(av_, raw.data(), buf, &len);
  return std::string(buf, strnlen(buf, sizeof buf));
}

std::string Endpoint::ResolveServer(const std::string& node, const std::string& service) const {
  if (IsShm(provider_)) {
    std::string name = ShmName(service);
    name.push_back('\0');
    return name;
  }
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_MSG | FI_RMA;
  hints->fabric_attr->prov_name = strdup(provider_.c_str());
  fi_info* info = nullptr;
  int rc = fi_getinfo(kApiVersion, node.c_str(), service.c_str(), 0, hints, &info);
  fi_freeinfo(hints);
  if (rc != 0 || !info || !info->dest_addr) {
    if (info) fi_freeinfo(info);
    Throw(ErrorKind::kUnavailable, "cannot resolve NAM server address " + node + ":" + service + " with provider '" +
                                       provider_ + "': " + FabricError(rc));
  }
  std::string addr(static_cast<const char*>(info->dest_addr), info->dest_addrlen);
  fi_freeinfo(info);
  return addr;
}

fi_addr_t Endpoint::Insert(std::string_view raw_addr) {
  if (raw_addr.empty()) Throw(ErrorKind::kInvalidInput, "empty fabric address");
  std::string copy(raw_addr);
  if (IsShm(provider_)) {
    // shm addresses are NUL-terminated strings of bounded length.
    if (copy.back() != '\0' || std::strlen(copy.c_str()) + 1 != copy.size() || copy.size() > 64)
      Throw(ErrorKind::kInvalidInput, "malformed shm address");
  } else if (info_->src_addrlen && copy.size() != info_->src_addrlen) {
    Throw(ErrorKind::kInvalidInput, "fabric address of " + std::to_string(copy.size()) + " bytes (expected " +
                                        std::to_string(info_->src_addrlen) + ")");
  }
  fi_addr_t out = FI_ADDR_NOTAVAIL;
  int n = fi_av_insert(av_, copy.data(), 1, &out, 0, nullptr);
  if (n != 1 || out == FI_ADDR_NOTAVAIL) Throw(ErrorKind::kInvalidInput, "fabric address rejected by fi_av_insert");
  return out;
}

void Endpoint::RemoveAddr(fi_addr_t a) { fi_av_remove(av_, &a, 1, 0); }

Registration Endpoint::Register(void* buf, size_t len, uint64_t access) {
  Registration r;
  uint64_t key = (mr_mode_ & FI_MR_PROV_KEY) ? 0 : g_next_key.fetch_add(1);
  int rc = fi_mr_reg(domain_, buf, len, access, 0, key, 0, &r.mr, nullptr);
  if (rc) Throw(ErrorKind::kInternal, "fi_mr_reg of " + std::to_string(len) + " bytes: " + FabricError(rc));
  if (mr_mode_ & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(r.mr, &ep_->fid, 0)) || (rc = fi_mr_enable(r.mr))) {
      fi_close(&r.mr->fid);
      Throw(ErrorKind::kInternal, "binding a memory region to the endpoint: " + FabricError(rc));
    }
  }
  r.desc = fi_mr_desc(r.mr);
  r.key = fi_mr_key(r.mr);
  r.base = (mr_mode_ & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(buf) : 0;
  return r;
}

void Endpoint::Deregister(Registration& r) {
  if (r.mr) fi_close(&r.mr->fid);
  r = Registration{};
}

ssize_t Endpoint::PostRecv(void* buf, size_t len, void* desc, OpContext* ctx) {
  return fi_recv(ep_, buf, len, desc, FI_ADDR_UNSPEC, ctx);
}

ssize_t Endpoint::PostSend(const void* buf, size_t len, void* desc, fi_addr_t dest, OpContext* ctx) {
  return fi_send(ep_, buf, len, desc, dest, ctx);
}

ssize_t Endpoint::PostWrite(const void* buf, size_t len, void* desc, fi_addr_t dest, uint64_t addr, uint64_t key,
                            OpContext* ctx) {
  return fi_write(ep_, buf, len, desc, dest, addr, key, ctx);
}

ssize_t Endpoint::PostRead(void* buf, size_t len, void* desc, fi_addr_t src, uint64_t addr, uint64_t key,
                           OpContext* ctx) {
  return fi_read(ep_, buf, len, desc, src, addr, key, ctx);
}

int Endpoint::Poll(Completion* out, int max, int timeout_ms) {
  fi_cq_data_entry entries[16];
  if (max > 16) max = 16;
  ssize_t n;
  if (timeout_ms >= 0 && can_wait_) {
    n = fi_cq_sread(cq_, entries, static_cast<size_t>(max), nullptr, timeout_ms);
  } else {
    n = fi_cq_read(cq_, entries, static_cast<size_t>(max));
    if (n == -FI_EAGAIN && timeout_ms > 0) {
      // Poll: spin briefly (shm completes in microseconds), then back off to short sleeps.
      auto start = std::chrono::steady_clock::now();
      auto deadline = start + std::chrono::milliseconds(timeout_ms);
      int spins = 0;
      while (n == -FI_EAGAIN && std::chrono::steady_clock::now() < deadline) {
        if (++spins > 200) {
          struct timespec ts {0, spins > 2000 ? 200000 : 20000};
          nanosleep(&ts, nullptr);
        }
        n = fi_cq_read(cq_, entries, static_cast<size_t>(max));
      }
    }
  }
  if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT || n == -FI_EINTR) return 0;
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    char buf[256];
    if (fi_cq_readerr(cq_, &err, 0) <= 0) return 0;
    out[0].ctx = static_cast<OpContext*>(err.op_context);
    out[0].len = err.len;
    out[0].err = err.err ? err.err : FI_EOTHER;
    const char* s = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof buf);
    out[0].what = FabricError(out[0].err) + (s && *s ? std::string(" (") + s + ")" : "");
    return 1;
  }
  if (n < 0) Throw(ErrorKind::kInternal, "fi_cq_read: " + FabricError(n));
  for (ssize_t i = 0; i < n; ++i) {
    out[i].ctx = static_cast<OpContext*>(entries[i].op_context);
    out[i].len = entries[i].len;
    out[i].err = 0;
    out[i].what.clear();
  }
  return static_cast<int>(n);
}

}  // namespace msaflow::nam::fabric
