// A machine file: which modules exist (cm, esb, dam) and what each offers. configs/machines/
// holds them; "local" (this machine, no Slurm) is built in. Fields: docs/slurm.md ("The machine file").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/fpga/device.h"

namespace msaflow::workflow {

// Where a machine's work runs: processes on this host, or Slurm jobs. Parsed once, here; only
// launch/MakeLauncher switches on it.
enum class LauncherKind { kLocal, kSlurm };
const char* LauncherName(LauncherKind k);  // "local", "slurm" (the machine file's words)
bool ParseLauncherKind(const std::string& name, LauncherKind* kind);  // false: not a launcher
// Whether a run's processes, its coordinator's among them, run on this host (not as jobs of a
// batch system): what a front end needs to know of a launcher.
bool OnThisHost(LauncherKind k);

struct ModuleSpec {
  std::string name;
  std::string description;
  int64_t max_ranks = 1;  // processes a step may use on this module
  // The memory of one of the module's nodes, in bytes ("memory": "64GiB"); 0 when the file
  // does not say. Launcher local: this host's physical memory unless the file says.
  uint64_t memory = 0;
  kernels::fpga::Config fpga;  // backend "cpu" unless the file says otherwise (docs/fpga.md)
  // Slurm (launcher "slurm"): where this module's hetjob component runs.
  std::string partition;   // default: the module's name
  std::string constraint;  // --constraint, if any
  std::string gres;        // --gres, e.g. "fpga:1"
  std::string feature;     // node feature marking this module's nodes (single mode)
  int64_t nodes = 1;
  std::string time = "30";  // --time of the component (Slurm time format)
};

// How a round becomes Slurm jobs (docs/slurm.md): one heterogeneous job of a component per
// module, one job per step each after the one before, or one plain job over every module's nodes.
enum class SlurmMode { kHetjob, kChained, kSingle };
const char* SlurmModeName(SlurmMode m);  // "hetjob", "chained", "single" (the machine file's words)
std::optional<SlurmMode> SlurmModeFromName(std::string_view name);

// Launcher "slurm": how rounds become jobs (docs/slurm.md).
struct SlurmSpec {
  SlurmMode mode = SlurmMode::kHetjob;
  // The modes tried, in order, when Slurm refuses a round's job(s) ("fallback": true is
  // ["chained"], false is []).
  std::vector<SlurmMode> fallback = {SlurmMode::kChained};
  std::string partition;  // single mode: the one partition holding every module's nodes
  std::string conf;       // SLURM_CONF for sbatch/scontrol/scancel ("" = Slurm's default)
  double poll_s = 0.25;
  // The nodes are namespaces of the machine msaflow runs on (the test clusters of
  // scripts/slurm-cluster.sh): their ranks share this machine's cores, as the simulator counts them.
  bool nodes_share_cores = false;
};

// A Slurm time limit ("30", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS",
// "UNLIMITED"/"INFINITE") in seconds, -1 for unlimited. Throws kInvalidInput naming `where`.
int64_t ParseSlurmTime(const std::string& t, const std::string& where);

// How a run reaches the NAM when the pipeline names none: a running NAM server the machine
// names (uri), a server started for the run (serve = true; it persists to <runs>/nam so later
// runs reuse what earlier ones stored), or the directory <runs>/nam as a file:// store.
// Under Slurm, `module` puts the started server on that module's nodes: as its own job, or as
// a component of the coordinator's job when the run was submitted (docs/slurm.md).
struct NamSpec {
  bool serve = false;
  std::string uri;                     // fabric://host:port?... of a running server
  std::string listen = "127.0.0.1:0";  // host "*" = the name of the node the server runs on
  std::string provider = "tcp";
  std::string capacity = "2GiB";
  std::string module;                  // launcher slurm: run the server on this module
};

struct Machine {
  std::string name;
  std::string source;  // what LoadMachine was given: "local", or the file's absolute path

  LauncherKind launcher = LauncherKind::kLocal;
  // Whether its steps run as processes of this host (the local launcher): the cores and the
  // OpenCL devices seen here are the ones the steps get.
  bool OnThisHost() const { return workflow::OnThisHost(launcher); }
  NamSpec nam;
  SlurmSpec slurm;
  std::map<std::string, ModuleSpec> modules;
  // Throws kInvalidInput "<where>: module 'x' is not in machine 'local' (has cm, dam, esb)".
  const ModuleSpec& Module(const std::string& name, const std::string& where) const;
};

// "local" -> the built-in machine; anything else is a path to a machine JSON file.
Machine LoadMachine(const std::string& name_or_path);
// Relative paths in the file (slurm.conf) resolve against `base_dir`.
Machine ParseMachine(const std::string& text, const std::string& origin, const std::string& base_dir);

}  // namespace msaflow::workflow
