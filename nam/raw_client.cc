#include "nam/raw_client.h"

#include <rdma/fi_errno.h>

#include <chrono>
#include <cstring>

#include "common/error.h"
#include "nam/fabric_store.h"

namespace msaflow::nam {

RawClient::RawClient(const std::string& uri) {
  FabricUri u = ParseFabricUri(uri);
  ep_ = fabric::Endpoint::Open(u.provider, u.host, u.port, false);
  server_ = ep_->Insert(ep_->ResolveServer(u.host, u.port));
  addr_ = ep_->Name();
  rbuf_.resize(wire::kMaxMessage);
  sbuf_.resize(wire::kMaxMessage * 2);
  rctx_.kind = 1;
  sctx_.kind = 2;
  if (ep_->PostRecv(rbuf_.data(), rbuf_.size(), nullptr, &rctx_) != 0)
    Throw(ErrorKind::kUnavailable, "raw client: cannot post a receive");
}

RawClient::Reply RawClient::Send(const std::string& bytes, double secs, uint64_t request) {
  if (bytes.size() > sbuf_.size()) Throw(ErrorKind::kInvalidInput, "raw client: message larger than the send buffer");
  std::memcpy(sbuf_.data(), bytes.data(), bytes.size());
  Reply got;
  while (ep_->PostSend(sbuf_.data(), bytes.size(), nullptr, server_, &sctx_) == -FI_EAGAIN) Drain(1, request, &got);
  const auto t0 = std::chrono::steady_clock::now();
  while (got.status < 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < secs)
    Drain(20, request, &got);
  return got;
}

std::string RawClient::Message(wire::Op op, std::string_view json, uint64_t session, uint64_t request,
                               std::string_view payload) const {
  wire::Header h;
  h.op = static_cast<uint16_t>(op);
  h.session = session;
  h.request = request;
  std::string out(wire::kMaxMessage, '\0');
  out.resize(wire::Build(h, addr_, json, payload, out.data()));
  return out;
}

void RawClient::Drain(int ms, uint64_t request, Reply* got) {
  fabric::Completion c[16];
  const int n = ep_->Poll(c, 16, ms);
  for (int i = 0; i < n; ++i) {
    if (c[i].ctx != &rctx_ || c[i].err) continue;
    wire::Message m;
    if (wire::Parse(rbuf_.data(), c[i].len, &m).empty() && (request == 0 || m.header.request == request)) {
      got->status = m.header.status;
      got->op = m.header.op;
      got->session = m.header.session;
      got->json.assign(m.json);
      const bool hello = m.header.op == (static_cast<uint16_t>(wire::Op::kHello) | wire::kReplyBit);
      if (hello && got->status == 0) session_ = m.header.session;
    }
    if (ep_->PostRecv(rbuf_.data(), rbuf_.size(), nullptr, &rctx_) != 0)
      Throw(ErrorKind::kUnavailable, "raw client: cannot post a receive");
  }
}

}  // namespace msaflow::nam
