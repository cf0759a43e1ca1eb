// libfabric, opened on first use rather than linked (issue 47 item 7).
//
// Debian's libfabric1 links the PSM libraries (libinfinipath, libpsm2), whose constructors
// calibrate a clock when they are loaded: 0.2 s of every process that links libfabric, though
// most msaflow processes (a module step that reads no NAM object over the fabric, `msaflow
// validate`, `plan`, the CLI's other commands) never call it. So msaflow does not link it: the
// five functions libfabric exports and msaflow calls are defined here and forward to the library,
// opened with dlopen the first time one of them is called. Everything else in its API (fi_domain,
// fi_endpoint, fi_cq_read, ...) is an inline function of the headers that calls through the
// objects these return.
#include <dlfcn.h>
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <signal.h>

#include <array>
#include <string>

#include "common/error.h"

namespace {

// The library's soname: the ABI msaflow's headers were written for (FI_MAJOR_VERSION 1).
constexpr const char* kSoname = "libfabric.so.1";

// The signals whose handlers the PSM libraries' constructors replace (with ones that call
// exit()): a NAM server's and a coordinator's own SIGTERM and SIGINT handlers must survive the
// library's late arrival, as they did when it was loaded before main().
constexpr std::array<int, 6> kKeptSignals = {SIGABRT, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1};

struct Library {
  decltype(&fi_getinfo) getinfo = nullptr;
  decltype(&fi_freeinfo) freeinfo = nullptr;
  decltype(&fi_dupinfo) dupinfo = nullptr;
  decltype(&fi_fabric) fabric = nullptr;
  decltype(&fi_strerror) strerror = nullptr;
};

template <typename F>
void Find(void* handle, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(::dlsym(handle, name));
  if (!*fn)
    msaflow::Throw(msaflow::ErrorKind::kUnsupported,
                   std::string(kSoname) + " has no " + name + " (libfabric 1.5 or later expected): " + ::dlerror());
}

Library Open() {
  // Held in this thread while the constructors' handlers are in place: a signal that arrives
  // meanwhile waits, and meets the process's own handler once it is back. (Another thread could
  // still take it; so the processes that handle stop signals load the library before they
  // install their handlers: fabric::LoadLibrary.)
  sigset_t hold, was;
  sigemptyset(&hold);
  for (const int sig : kKeptSignals) sigaddset(&hold, sig);
  ::pthread_sigmask(SIG_BLOCK, &hold, &was);
  std::array<struct sigaction, kKeptSignals.size()> kept{};
  for (size_t i = 0; i < kKeptSignals.size(); ++i) ::sigaction(kKeptSignals[i], nullptr, &kept[i]);
  void* handle = ::dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  for (size_t i = 0; i < kKeptSignals.size(); ++i) ::sigaction(kKeptSignals[i], &kept[i], nullptr);
  ::pthread_sigmask(SIG_SETMASK, &was, nullptr);
  if (!handle)
    msaflow::Throw(msaflow::ErrorKind::kNotFound, std::string("the NAM's fabric needs libfabric: ") + ::dlerror() +
                                                      " (Debian: apt-get install libfabric1)");
  Library lib;
  Find(handle, "fi_getinfo", &lib.getinfo);
  Find(handle, "fi_freeinfo", &lib.freeinfo);
  Find(handle, "fi_dupinfo", &lib.dupinfo);
  Find(handle, "fi_fabric", &lib.fabric);
  Find(handle, "fi_strerror", &lib.strerror);
  return lib;  // never closed: the fabric's objects live until the process ends
}

const Library& Lib() {
  static const Library lib = Open();  // once, thread-safe
  return lib;
}

}  // namespace

namespace msaflow::nam::fabric {

void LoadLibrary() { Lib(); }

}  // namespace msaflow::nam::fabric

extern "C" {

int fi_getinfo(uint32_t version, const char* node, const char* service, uint64_t flags, const struct fi_info* hints,
               struct fi_info** info) {
  return Lib().getinfo(version, node, service, flags, hints, info);
}

void fi_freeinfo(struct fi_info* info) {
  if (info) Lib().freeinfo(info);
}

struct fi_info* fi_dupinfo(const struct fi_info* info) {
  return Lib().dupinfo(info);
}

int fi_fabric(struct fi_fabric_attr* attr, struct fid_fabric** fabric, void* context) {
  return Lib().fabric(attr, fabric, context);
}

const char* fi_strerror(int errnum) { return Lib().strerror(errnum); }

}  // extern "C"
