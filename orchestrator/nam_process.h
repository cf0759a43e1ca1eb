// A NAM server started for a run (`msaflow nam serve` as a child process) and stopped by its
// PID when the run ends, however it ends.
#pragma once

#include <sys/types.h>

#include <string>

#include "orchestrator/machine.h"

namespace msaflow::orchestrator {

class NamServerProcess {
 public:
  // Starts the server and waits until it serves (its ready file appears). Throws
  // kUnavailable with the end of the server's log when it exits or does not come up in 30 s.
  NamServerProcess(const std::string& msaflow_exe, const NamSpec& spec, const std::string& persist_dir,
                   const std::string& log_path, const std::string& ready_path);
  ~NamServerProcess();  // SIGTERM; SIGKILL after 10 s
  NamServerProcess(const NamServerProcess&) = delete;
  NamServerProcess& operator=(const NamServerProcess&) = delete;

  const std::string& uri() const { return uri_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  std::string uri_;
};

}  // namespace msaflow::orchestrator
