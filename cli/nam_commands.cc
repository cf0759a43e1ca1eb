// The NAM by hand: serve, put, get, stat, ls, rm, verify, df.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "common/files.h"
#include "common/strings.h"
#include "nam/fabric.h"
#include "nam/fabric_store.h"
#include "nam/pool.h"
#include "nam/server.h"
#include "nam/store.h"
#include "nam/verify.h"

namespace msaflow::cli {
namespace {

std::atomic<bool> g_stop{false};
void OnStopSignal(int) { g_stop.store(true); }

}  // namespace

int NamServe(Options& o) {
  o.sopt.capacity = nam::ParseSize(o.capacity, "--capacity");
  o.sopt.allow_map = !o.no_map;
  nam::fabric::LoadLibrary();  // before the handlers, which its loading would otherwise race (nam/fabric.h)
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  nam::Server server(o.sopt);
  server.Run(g_stop);
  return 0;
}

int NamPut(Options& o) {
  std::string bytes;
  if (o.obj_file.empty() || o.obj_file == "-") {
    bytes.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    bytes = ReadFile(o.obj_file);
  }
  nlohmann::json meta = nlohmann::json::object();
  if (!o.meta_text.empty()) {
    meta = nlohmann::json::parse(o.meta_text, nullptr, false);
    if (meta.is_discarded() || !meta.is_object())
      Throw(ErrorKind::kInvalidInput, "--meta: expected a JSON object, got '" + o.meta_text + "'");
  }
  auto store = nam::OpenStore(NamUri(o.nam_uri));
  auto info = store->Put(o.obj_name, bytes, meta);
  std::printf("put %s: %llu bytes, version %llu, checksum %s\n", info.name.c_str(),
              static_cast<unsigned long long>(info.size), static_cast<unsigned long long>(info.version),
              info.checksum.c_str());
  return 0;
}

int NamGet(Options& o) {
  auto store = nam::OpenStore(NamUri(o.nam_uri));
  std::string bytes;
  store->GetInto(o.obj_name, bytes);
  if (o.out_file.empty()) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
      ThrowErrno("writing to stdout");
  } else {
    WriteFileAtomic(o.out_file, bytes);
  }
  return 0;
}

int NamStat(Options& o) {
  auto store = nam::OpenStore(NamUri(o.nam_uri));
  auto info = store->Stat(o.obj_name);
  if (!info) Throw(ErrorKind::kNotFound, "NAM " + store->Uri() + ": no object '" + o.obj_name + "'");
  PrintInfo(*info);
  return 0;
}

int NamLs(Options& o) {
  auto store = nam::OpenStore(NamUri(o.nam_uri));
  for (const auto& i : store->List(o.prefix)) {
    if (o.as_json) {
      std::printf("%s\n", nlohmann::json({{"name", i.name}, {"size", i.size}, {"checksum", i.checksum},
                                           {"version", i.version}, {"meta", i.meta}}).dump().c_str());
    } else if (i.meta.contains("damaged")) {
      std::printf("%12s  %-5s %-16s  %s  (%s)\n", "-", "-", "DAMAGED", i.name.c_str(),
                  i.meta["damaged"].get<std::string>().c_str());
    } else {
      std::printf("%12llu  v%-4llu %s  %s\n", static_cast<unsigned long long>(i.size),
                  static_cast<unsigned long long>(i.version), i.checksum.c_str(), i.name.c_str());
    }
  }
  return 0;
}

int NamRm(Options& o) {
  auto store = nam::OpenStore(NamUri(o.nam_uri));
  if (!store->Remove(o.obj_name)) Throw(ErrorKind::kNotFound, "NAM " + store->Uri() + ": no object '" + o.obj_name + "'");
  std::printf("removed %s\n", o.obj_name.c_str());
  return 0;
}

int NamVerify(Options& o) {
  auto store = nam::OpenStore(NamUri(o.nam_uri));
  nam::VerifyReport r = nam::Verify(*store, o.repair);
  for (const auto& d : r.damaged)
    std::printf("DAMAGED %s: %s%s\n", Printable(d.name, 300).c_str(), d.why.c_str(),
                d.moved_to.empty() ? "" : ("\n  -> " + d.moved_to).c_str());
  std::printf("%s: %lld objects checked, %s of good data, %zu damaged%s\n", store->Uri().c_str(),
              static_cast<long long>(r.objects), HumanBytes(static_cast<double>(r.bytes)).c_str(), r.damaged.size(),
              r.damaged.empty() ? "" : o.repair ? " (moved aside)" : " (run with --repair to move them aside)");
  return r.damaged.empty() || o.repair ? 0 : ExitCode(ErrorKind::kCorrupt);
}

int NamDf(Options& o) {
  std::string uri = NamUri(o.nam_uri);
  if (uri.rfind("fabric://", 0) != 0) Throw(ErrorKind::kUnsupported, "nam df: '" + uri + "' is not a NAM server (fabric://)");
  nam::FabricStore store(uri);
  std::printf("%s\n", store.Capacity().dump(2).c_str());
  return 0;
}

}  // namespace msaflow::cli
