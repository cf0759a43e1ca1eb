// A machine file: which modules exist (cm, esb, dam) and what each offers. configs/machines/
// holds them; "local" (this machine, no Slurm) is built in. docs/machines.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace msaflow::orchestrator {

struct ModuleSpec {
  std::string name;
  std::string description;
  int64_t max_ranks = 1;  // processes a step may use on this module
  std::string fpga;       // "", "simulated", "opencl"
  // Slurm (launcher "slurm"): where this module's hetjob component runs.
  std::string partition;   // default: the module's name
  std::string constraint;  // --constraint, if any
  std::string gres;        // --gres, e.g. "fpga:1"
  int64_t nodes = 1;
  std::string time = "30";  // --time of the component (Slurm time format)
};

// Launcher "slurm": how rounds become jobs (docs/slurm.md).
struct SlurmSpec {
  std::string mode = "hetjob";  // "hetjob" | "chained"
  bool fallback = true;         // a refused hetjob falls back to chained
  std::string conf;             // SLURM_CONF for sbatch/scontrol/scancel ("" = Slurm's default)
  double poll_s = 0.25;
};

// How a run reaches the NAM when the pipeline names none: start a server for the run
// (serve = true; it persists to <runs>/nam so later runs reuse what earlier ones stored), or
// use the directory <runs>/nam as a file:// store.
struct NamSpec {
  bool serve = false;
  std::string listen = "127.0.0.1:0";
  std::string provider = "tcp";
  std::string capacity = "2GiB";
};

struct Machine {
  std::string name;
  std::string launcher = "local";  // "local" | "slurm"
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

}  // namespace msaflow::orchestrator
