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
};

struct Machine {
  std::string name;
  std::string launcher = "local";
  std::map<std::string, ModuleSpec> modules;
  // Throws kInvalidInput "<where>: module 'x' is not in machine 'local' (has cm, dam, esb)".
  const ModuleSpec& Module(const std::string& name, const std::string& where) const;
};

// "local" -> the built-in machine; anything else is a path to a machine JSON file.
Machine LoadMachine(const std::string& name_or_path);
Machine ParseMachine(const std::string& text, const std::string& origin);

}  // namespace msaflow::orchestrator
