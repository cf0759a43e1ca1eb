#include "record/provenance.h"

#include <set>

namespace msaflow::record {

using workflow::Candidate;
using workflow::CandidateFromJson;
using workflow::HeadLabel;

using nlohmann::json;

json ProvenanceTask(const workflow::Task& t, const json& done, const std::string& how, double seconds, const std::string& started) {
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

json ProvenanceRound(int round, json tasks, const json& best, const std::map<std::string, json>& curves) {
  json cands = json::array();
  for (const auto& e : best.at("all")) {
    const Candidate c = CandidateFromJson(e.at("candidate"));
    json entry = {{"candidate", c.id}, {"round", e.value("round", round)}, {"backbone", c.backbone},
                  {"head", HeadLabel(c.head)}, {"model", e.value("model", "")}, {"result", e.value("result", "")},
                  {"accuracy", e.value("accuracy", 0.0)}};
    if (e.contains("test")) entry["test_accuracy"] = e["test"].value("accuracy", 0.0);
    if (auto it = curves.find(entry["model"]); it != curves.end()) entry["curve"] = it->second;
    cands.push_back(std::move(entry));
  }
  const json& champ = best.at("champion");
  return {{"round", round}, {"tasks", std::move(tasks)}, {"candidates", cands},
          {"champion", {{"candidate", champ.at("candidate").at("id")}, {"model", champ.value("model", "")},
                        {"accuracy", champ.value("accuracy", 0.0)}}}};
}

json ConfusionOf(const json& body) {
  const bool test = body.is_object() && body.contains("test") && body["test"].is_object();
  const json& m = test ? body["test"] : body;
  if (!m.is_object() || !m.contains("confusion") || !m["confusion"].is_array() || !m.contains("classes") ||
      !m["classes"].is_number_integer())
    return nullptr;
  const int64_t k = m["classes"].get<int64_t>();
  const json& flat = m["confusion"];
  if (k <= 0 || flat.size() != static_cast<size_t>(k * k)) return nullptr;
  json rows = json::array();
  for (int64_t t = 0; t < k; ++t) {
    json row = json::array();
    for (int64_t p = 0; p < k; ++p) row.push_back(flat[static_cast<size_t>(t * k + p)]);
    rows.push_back(std::move(row));
  }
  // The classes' names by index: the image folder's (recorded by evaluate), else the index.
  json names = json::array();
  const json& given = m.contains("class_names") && m["class_names"].is_array() ? m["class_names"] : json::array();
  for (int64_t t = 0; t < k; ++t) {
    const auto i = static_cast<size_t>(t);
    names.push_back(i < given.size() && given[i].is_string() ? given[i].get<std::string>() : std::to_string(t));
  }
  return {{"split", test ? std::string("test") : body.value("split", std::string("validation"))},
          {"classes", k},
          {"class_names", std::move(names)},
          {"matrix", std::move(rows)}};
}

}  // namespace msaflow::record
