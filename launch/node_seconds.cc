#include "launch/node_seconds.h"

#include <fmt/core.h>

namespace msaflow::launch {

std::vector<NodeSeconds> MeasureNodeSeconds(const std::map<std::string, double>& step_seconds,
                                            const workflow::Pipeline& p, const workflow::Machine& m,
                                            workflow::SlurmMode mode, double round_s) {
  std::map<std::string, NodeSeconds> by_module;
  for (const auto& [step, secs] : step_seconds) {
    const workflow::StepSpec* spec = p.FindStep(step);
    if (!spec) continue;
    const workflow::ModuleSpec& mod = m.Module(spec->module, "steps/" + step);
    NodeSeconds& ns = by_module[mod.name];
    ns.module = mod.name;
    ns.nodes = mod.nodes;
    ns.used_s += secs * static_cast<double>(mod.nodes);
  }
  std::vector<NodeSeconds> out;
  for (auto& [name, ns] : by_module) {
    ns.held_s = mode == workflow::SlurmMode::kChained ? ns.used_s : round_s * static_cast<double>(ns.nodes);
    out.push_back(ns);
  }
  return out;
}

std::string NodeSecondsSummary(const std::vector<NodeSeconds>& ns, workflow::SlurmMode mode, size_t steps,
                               double job_start_s) {
  double held = 0, used = 0;
  std::string parts;
  for (const auto& n : ns) {
    held += n.held_s;
    used += n.used_s;
    parts += fmt::format("{}{} held {:.1f} used {:.1f}", parts.empty() ? "" : ", ", n.module, n.held_s, n.used_s);
  }
  std::string s = fmt::format("node-seconds ({}): {}; {:.0f} % of what was held was used",
                              workflow::SlurmModeName(mode), parts, held > 0 ? 100 * used / held : 0.0);
  if (mode != workflow::SlurmMode::kChained) {
    // Chained jobs hold each module for its step only, and wait in the queue once per step.
    const double chained = used;
    const double waits = job_start_s * static_cast<double>(steps);
    s += chained < held
             ? fmt::format("; chained jobs would hold {:.1f} node-s instead of {:.1f} (cheaper, for ~{:.0f} s more "
                           "of queue waits: {} jobs at ~{:.1f} s each)",
                           chained, held, waits, steps, job_start_s)
             : fmt::format("; chained jobs would hold as much ({:.1f} node-s) and add {} queue waits", chained, steps);
  }
  return s;
}

}  // namespace msaflow::launch
