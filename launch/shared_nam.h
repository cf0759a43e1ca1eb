// The NAM server the local runs of one runs directory share. Beside the persisted objects
// (<runs>/nam/) lie the server's address (<runs>/nam-server.json: uri, pid), its log
// (<runs>/nam-server.log) and two lock files: a run holds a shared lock on
// <runs>/nam-server.users for as long as it uses the server, and the server stops once nobody
// holds one (so a killed coordinator's use ends with it); <runs>/nam-server.start serialises
// runs that find no server, so two runs started at once start one server, not two. A server
// started by hand with `msaflow nam serve --persist <runs>/nam --ready-file <runs>/nam-server.json`
// (no --users-lock) serves every run until it is stopped.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "workflow/machine.h"
#include "launch/nam_process.h"

namespace msaflow::launch {

class SharedNamServer {
 public:
  // Attaches to the runs directory's server, or starts one (waiting up to `lock_wait_s` for a
  // stopping predecessor to let go of the objects). Throws kUnavailable like NamServerProcess.
  SharedNamServer(const std::string& msaflow_exe, const NamSpec& spec, const std::string& runs_dir,
                  double lock_wait_s);
  ~SharedNamServer();  // this run's use ends; the server stops when it was the last
  SharedNamServer(const SharedNamServer&) = delete;
  SharedNamServer& operator=(const SharedNamServer&) = delete;

  const std::string& uri() const { return uri_; }
  pid_t pid() const { return pid_; }
  bool attached() const { return !started_; }  // false: this run started it
  const std::string& log() const { return log_; }
  const std::string& persist() const { return persist_; }
  // "" while the server runs, else what is known of its end (liveness).
  std::string Exited();

 private:
  int users_fd_ = -1;
  std::unique_ptr<NamServerProcess> started_;
  pid_t pid_ = -1;
  std::string uri_, log_, persist_;
};

}  // namespace msaflow::launch
