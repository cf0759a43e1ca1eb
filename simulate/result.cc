// A simulated run as JSON and as the table `msaflow simulate` prints (no SimGrid needed).
#include <fmt/core.h>

#include "simulate/simulate.h"

namespace msaflow::simulate {

using json = nlohmann::json;

json ToJson(const Result& r) {
  json rounds = json::array();
  for (const auto& rr : r.rounds) {
    json steps = json::array();
    for (const auto& s : rr.steps) {
      json j = {{"step", workflow::StepName(s.step)},
                {"module", s.module},
                {"ranks", s.ranks},
                {"nodes", s.nodes},
                {"start_s", s.start_s},
                {"seconds", s.seconds}};
      if (s.measured_s > 0) j["measured_s"] = s.measured_s;
      steps.push_back(j);
    }
    rounds.push_back({{"round", rr.round}, {"start_s", rr.start_s}, {"seconds", rr.seconds}, {"steps", steps}});
  }
  json ns = json::object();
  for (const auto& [mod, n] : r.node_seconds) ns[mod] = {{"held", n.held}, {"used", n.used}};
  return {{"makespan_s", r.makespan_s},
          {"rounds", rounds},
          {"node_seconds", ns},
          {"placement", r.placement},
          {"simulation",
           {{"wall_s", r.simulation_wall_s},
            {"hosts", r.hosts},
            {"actors", r.actors},
            {"speedup", r.simulation_wall_s > 0 ? r.makespan_s / r.simulation_wall_s : 0}}}};
}

std::string Table(const Result& r) {
  std::string out;
  for (const auto& rr : r.rounds) {
    out += fmt::format("round {}: {:.1f} s (from {:.1f} s)\n", rr.round, rr.seconds, rr.start_s);
    for (const auto& s : rr.steps)
      out += fmt::format("  {:<9} {:<4} {:>4} rank{} on {:>4} node{}  {:>9.2f} s{}\n", workflow::StepName(s.step),
                         s.module, s.ranks, s.ranks == 1 ? " " : "s", s.nodes, s.nodes == 1 ? " " : "s", s.seconds,
                         s.measured_s > 0 ? fmt::format("  (measured {:.2f} s)", s.measured_s) : "");
  }
  out += fmt::format("makespan {:.1f} s\n", r.makespan_s);
  for (const auto& [mod, n] : r.node_seconds)
    out += fmt::format("  {:<4} node-seconds held {:>10.1f}, used {:>10.1f}\n", mod, n.held, n.used);
  for (const auto& [step, f] : r.placement["favoured_ranks"].items())
    out += fmt::format("  {:<9} the model favours {} rank(s): {:.2f} s (at most {})\n", step, f["ranks"].get<int64_t>(),
                       f["seconds"].get<double>(), f["limit"].get<int64_t>());
  out += fmt::format("simulated in {:.3f} s ({} hosts, {} actors)\n", r.simulation_wall_s, r.hosts, r.actors);
  return out;
}

}  // namespace msaflow::simulate
