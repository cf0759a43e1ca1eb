// A NAM client process for the integration tests (tests/integration/nam_test.py).
//
//   nam_stress roundtrip URI CLIENT SIZE...   put c<CLIENT>/<size> for each size, read each
//                                             back and compare every byte; print "verified N"
//   nam_stress writer URI CLIENT SIZE         put w<CLIENT>/<i> for i = 0, 1, ... until an
//                                             error; print "start NAME" before each put and
//                                             "committed NAME" after it
//   nam_stress hold URI NAME SIZE             allocate NAME and never commit it; print "held"
//                                             and wait to be killed
//   nam_stress verify URI NAME...             every NAME must exist with the bytes its name
//                                             implies; and every object present must too
//
// Object bytes are a function of the name, so any process can check any object.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/error.h"
#include "nam/fabric.h"
#include "nam/fabric_store.h"
#include "nam/protocol.h"

namespace {

using namespace msaflow;

std::string Bytes(const std::string& name, size_t size) {
  std::string s(size, '\0');
  std::mt19937_64 rng(Checksum64(name));
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t v = rng();
    std::memcpy(&s[i], &v, 8);
  }
  for (; i < size; ++i) s[i] = static_cast<char>(rng());
  return s;
}

// Names carry their size: <prefix>/<size>[-<i>].
size_t SizeOf(const std::string& name) {
  size_t slash = name.rfind('/');
  return std::stoull(name.substr(slash + 1));
}

int Roundtrip(nam::FabricStore& s, int client, const std::vector<size_t>& sizes) {
  std::string back;
  for (size_t n : sizes) {
    std::string name = "c" + std::to_string(client) + "/" + std::to_string(n);
    std::string bytes = Bytes(name, n);
    s.Put(name, bytes, {{"client", client}});
    s.GetInto(name, back);
    if (back != bytes) {
      std::printf("MISMATCH %s\n", name.c_str());
      return 1;
    }
  }
  // Read back everything once more, after all puts of this client.
  for (size_t n : sizes) {
    std::string name = "c" + std::to_string(client) + "/" + std::to_string(n);
    s.GetInto(name, back);
    if (back != Bytes(name, n)) {
      std::printf("MISMATCH %s\n", name.c_str());
      return 1;
    }
  }
  std::printf("verified %zu via %s\n", sizes.size(), s.Transport().c_str());
  return 0;
}

int Writer(nam::FabricStore& s, int client, size_t size) {
  for (int i = 0;; ++i) {
    std::string name = "w" + std::to_string(client) + "-" + std::to_string(i) + "/" + std::to_string(size);
    std::printf("start %s\n", name.c_str());
    std::fflush(stdout);
    s.Put(name, Bytes(name, size), nullptr);
    std::printf("committed %s\n", name.c_str());
    std::fflush(stdout);
  }
}

int Hold(const std::string& uri, const std::string& name, size_t size) {
  nam::FabricUri u = nam::ParseFabricUri(uri);
  auto ep = nam::fabric::Endpoint::Open(u.provider, u.host, u.port, false);
  fi_addr_t server = ep->Insert(ep->ResolveServer(u.host, u.port));
  std::string addr = ep->Name();
  std::vector<char> rbuf(nam::wire::kMaxMessage), sbuf(nam::wire::kMaxMessage);
  nam::fabric::OpContext rctx{}, sctx{};
  uint64_t session = 0;
  auto call = [&](nam::wire::Op op, const nlohmann::json& body) {
    nam::wire::Header h;
    h.op = static_cast<uint16_t>(op);
    h.session = session;
    h.request = 1;
    size_t len = nam::wire::Build(h, addr, body.dump(), {}, sbuf.data());
    if (ep->PostRecv(rbuf.data(), rbuf.size(), nullptr, &rctx)) Throw(ErrorKind::kInternal, "recv");
    while (ep->PostSend(sbuf.data(), len, nullptr, server, &sctx) != 0) {
      nam::fabric::Completion c[4];
      ep->Poll(c, 4, 5);
    }
    for (int i = 0; i < 500; ++i) {
      nam::fabric::Completion c[4];
      int n = ep->Poll(c, 4, 10);
      for (int k = 0; k < n; ++k)
        if (c[k].ctx == &rctx) {
          nam::wire::Message m;
          nam::wire::Parse(rbuf.data(), c[k].len, &m);
          if (m.header.status != 0) Throw(ErrorKind::kInternal, std::string(m.json));
          session = m.header.session;
          return;
        }
    }
    Throw(ErrorKind::kUnavailable, "no reply");
  };
  call(nam::wire::Op::kHello, {{"pid", getpid()}});
  call(nam::wire::Op::kAlloc, {{"name", name}, {"size", size}, {"via", "rma"}});
  std::printf("held\n");
  std::fflush(stdout);
  for (;;) {
    nam::fabric::Completion c[4];
    ep->Poll(c, 4, 100);
  }
}

int Verify(nam::FabricStore& s, const std::vector<std::string>& names) {
  std::string back;
  for (const auto& name : names) {
    s.GetInto(name, back);
    if (back != Bytes(name, SizeOf(name))) {
      std::printf("MISMATCH %s\n", name.c_str());
      return 1;
    }
  }
  size_t present = 0;
  for (const auto& info : s.List("")) {
    s.GetInto(info.name, back);
    if (back != Bytes(info.name, SizeOf(info.name))) {
      std::printf("MISMATCH %s\n", info.name.c_str());
      return 1;
    }
    std::printf("present %s\n", info.name.c_str());
    ++present;
  }
  std::printf("verified %zu named, %zu present\n", names.size(), present);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: nam_stress roundtrip|writer|hold|verify URI ...\n");
    return 2;
  }
  std::string mode = argv[1], uri = argv[2];
  try {
    if (mode == "hold") return Hold(uri, argv[3], std::stoull(argv[4]));
    nam::FabricStore s(uri);
    if (mode == "roundtrip") {
      std::vector<size_t> sizes;
      for (int i = 4; i < argc; ++i) sizes.push_back(std::stoull(argv[i]));
      return Roundtrip(s, std::atoi(argv[3]), sizes);
    }
    if (mode == "writer") return Writer(s, std::atoi(argv[3]), std::stoull(argv[4]));
    if (mode == "verify") return Verify(s, std::vector<std::string>(argv + 3, argv + argc));
  } catch (const Error& e) {
    std::printf("error: %s\n", e.what());
    std::fprintf(stderr, "nam_stress: %s: %s\n", ErrorKindName(e.kind()), e.what());
    return 3;
  }
  return 2;
}
