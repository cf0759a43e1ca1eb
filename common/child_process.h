// One way to start and watch a child process: the local launcher's steps, the NAM server (a
// run's own or a runs directory's shared one), and the Slurm commands all start here. Every
// child gets its environment and file descriptors set up before fork (only async-signal-safe
// calls between fork and exec), may be told to die with its parent (a parent-death signal, so
// no step outlives a killed coordinator), and is reaped exactly once.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace msaflow {

// How a child ended.
struct ExitStatus {
  int code = -1;   // its exit status, when it exited
  int signal = 0;  // the signal that ended it, when one did
  bool ok() const { return signal == 0 && code == 0; }
  std::string Describe() const;  // "exit status 3", "signal 9 (Killed)"
  static ExitStatus FromWait(int wait_status);
};

struct SpawnOptions {
  enum class Output { kInherit, kPipe, kFile, kNull };
  Output output = Output::kInherit;  // stdout and stderr
  bool separate_stderr = false;      // kPipe: stderr on a pipe of its own (error_fd())
  std::string output_file;           // kFile: appended to (created 0644)
  bool stdin_null = false;           // stdin from /dev/null
  int death_signal = 0;              // sent to the child when this process dies (0: none)
  bool new_session = false;          // setsid(): a Ctrl-C of this process's group does not reach it
  std::vector<std::string> set_env;  // "NAME=VALUE", added or replacing
  std::function<bool(const std::string& name)> drop_env;  // variables to leave out
};

class ChildProcess {
 public:
  ChildProcess() = default;
  // Starts argv[0] (searched on PATH when it has no '/'). Throws kNotFound when it is not there
  // and kIo when the system refuses (pipe, open, fork).
  static ChildProcess Start(const std::vector<std::string>& argv, const SpawnOptions& opt = {});
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // A child still running is killed (SIGKILL) and reaped, unless Release()d.
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  int output_fd() const { return out_fd_; }  // kPipe: read end (stdout, and stderr unless separate)
  int error_fd() const { return err_fd_; }   // kPipe with separate_stderr
  void CloseOutput();                        // closes the read ends

  // The exit status once the child has ended (reaped here), else nothing. Never blocks.
  std::optional<ExitStatus> Poll();
  ExitStatus Wait();  // blocks until it ends
  // Waits up to `seconds` of `clock`; the status when it ended in time.
  std::optional<ExitStatus> WaitFor(double seconds, Clock& clock = SystemClock());
  void Signal(int sig);  // nothing once it has been reaped
  // Sends `sig`, waits up to `grace_s`, then SIGKILL; returns how it ended.
  ExitStatus Stop(int sig, double grace_s);
  // Forgets the child: it runs on (a detached server); this object no longer reaps it, and
  // ReapReleasedChildren() does once it has ended.
  void Release();

 private:
  void Reset();  // what the destructor does
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  std::optional<ExitStatus> status_;
};

// Reaps the Release()d children that have ended, without blocking, so that a long-lived
// process (a scaling study's runs, each starting a shared NAM server that stops on its own
// later) leaves no zombies, and a zombie's pid never passes for a live server. Returns how
// many released children are still running.
size_t ReapReleasedChildren();

// Runs argv to its end and returns its status and output. A program not on PATH gives exit
// status 127 and says so in `err`, as a shell would; after `timeout_s` it is killed.
struct Captured {
  ExitStatus status;
  std::string out, err;
  bool timed_out = false;
};
Captured RunCaptured(const std::vector<std::string>& argv, SpawnOptions opt = {}, double timeout_s = 30);

// The first executable `name` on PATH, or "".
std::string FindOnPath(const std::string& name);

}  // namespace msaflow
