#include "orchestrator/provenance.h"

#include <set>

namespace msaflow::orchestrator {

using nlohmann::json;

json ProvenanceTask(const Task& t, const json& done, const std::string& how, double seconds, const std::string& started) {
  std::set<std::string> hosts;
  uint64_t put = 0, got = 0;
  for (const auto& r : done.value("ranks", json::array())) {
    hosts.insert(r.value("host", ""));
    put += r.value("put_bytes", uint64_t{0});
    got += r.value("got_bytes", uint64_t{0});
  }
  json e = {{"task", t.id}, {"step", t.step}, {"module", t.module}, {"ranks", t.ranks}, {"hosts", hosts},
            {"how", how}, {"key", done.value("key", "")}, {"msaflow", done.value("msaflow", "")},
            {"inputs", done.value("inputs", json::object())},
            {"nam_bytes", {{"put", put}, {"got", got}}},
            {"outputs", done.value("outputs", json::array()).size()}};
  if (seconds > 0) e["seconds"] = seconds;
  if (!started.empty()) e["started"] = started;
  return e;
}

json ProvenanceRound(int round, json tasks, const RoundOutcome& o) {
  json cands = json::array();
  for (const auto& e : o.best.at("all")) {
    const Candidate c = CandidateFromJson(e.at("candidate"));
    json entry = {{"candidate", c.id}, {"round", e.value("round", round)}, {"backbone", c.backbone},
                  {"head", HeadLabel(c.head)}, {"model", e.value("model", "")}, {"result", e.value("result", "")},
                  {"accuracy", e.value("accuracy", 0.0)}};
    if (e.contains("test")) entry["test_accuracy"] = e["test"].value("accuracy", 0.0);
    cands.push_back(std::move(entry));
  }
  const json& champ = o.best.at("champion");
  return {{"round", round}, {"tasks", std::move(tasks)}, {"candidates", cands},
          {"champion", {{"candidate", champ.at("candidate").at("id")}, {"model", champ.value("model", "")},
                        {"accuracy", champ.value("accuracy", 0.0)}}}};
}

}  // namespace msaflow::orchestrator
