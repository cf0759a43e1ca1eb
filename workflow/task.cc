#include "workflow/task.h"

#include "common/checksum.h"
#include "common/error.h"
#include "workflow/fpga_config.h"

namespace msaflow::workflow {
namespace {

using nlohmann::json;

[[noreturn]] void BadTask(const std::string& origin, const std::string& field, const std::string& what) {
  Throw(ErrorKind::kInvalidInput, origin + ": " + field + ": " + what);
}

const json& Field(const json& j, const std::string& key, const std::string& origin, json::value_t type) {
  if (!j.contains(key)) BadTask(origin, key, "missing");
  const json& v = j[key];
  bool ok = type == json::value_t::number_integer ? v.is_number_integer()
            : type == json::value_t::number_float ? v.is_number()
                                                   : v.type() == type;
  if (!ok) BadTask(origin, key, "expected " + std::string(json(type).type_name()) + ", got " + v.type_name());
  return v;
}

}  // namespace

int64_t TrainLayout::BatchShare(int64_t batch) const {
  int64_t share = 1;  // the ranks one batch is split over
  switch (mode) {
    case TrainMode::kSync:
      share = ranks;
      break;
    case TrainMode::kHybrid:
      share = ranks / std::max<int64_t>(1, groups);
      break;
    case TrainMode::kAuto:
    case TrainMode::kIndependent:
    case TrainMode::kAsync:
      break;
  }
  return (batch + share - 1) / std::max<int64_t>(1, share);
}

json TrainLayout::ToJson() const {
  json j = {{"mode", TrainModeName(mode)},
            {"ranks", ranks},
            {"servers", servers},
            {"groups", groups},
            {"max_staleness", max_staleness},
            {"straggler", {{"rank", straggler_rank}, {"factor", straggler_factor}}}};
  if (rank_memory > 0) j["rank_memory"] = rank_memory;  // absent when not said, as before it was written
  return j;
}

TrainLayout TrainLayoutFromJson(const json& j, const std::string& where) {
  if (!j.is_object()) BadTask(where, "train", "expected an object");
  TrainLayout t;
  const std::string mode = Field(j, "mode", where + ": train", json::value_t::string).get<std::string>();
  auto parsed = TrainModeFromName(mode);
  if (!parsed || *parsed == TrainMode::kAuto)
    BadTask(where, "train/mode", "\"" + mode.substr(0, 40) + "\" is not one of independent, sync, async, hybrid");
  t.mode = *parsed;
  t.ranks = Field(j, "ranks", where + ": train", json::value_t::number_integer).get<int64_t>();
  t.servers = Field(j, "servers", where + ": train", json::value_t::number_integer).get<int64_t>();
  t.groups = Field(j, "groups", where + ": train", json::value_t::number_integer).get<int64_t>();
  t.max_staleness = Field(j, "max_staleness", where + ": train", json::value_t::number_integer).get<int64_t>();
  const json& st = Field(j, "straggler", where + ": train", json::value_t::object);
  t.straggler_rank = Field(st, "rank", where + ": train/straggler", json::value_t::number_integer).get<int64_t>();
  t.straggler_factor = Field(st, "factor", where + ": train/straggler", json::value_t::number_float).get<double>();
  if (j.contains("rank_memory"))  // tasks planned before it was written hold none
    t.rank_memory = Field(j, "rank_memory", where + ": train", json::value_t::number_integer).get<int64_t>();
  if (t.rank_memory < 0 || t.ranks < 1 || t.servers < 0 || t.groups < 1 || t.max_staleness < 0 ||
      t.ranks % t.groups != 0 || !(t.straggler_factor >= 1))
    BadTask(where, "train", "inconsistent layout " + t.ToJson().dump());
  return t;
}

TaskSpec ParseTask(const json& body, const std::string& origin) {
  if (!body.is_object()) BadTask(origin, "/", "expected a JSON object (a task file)");
  TaskSpec t;
  if (body.value("format", json()) != kTaskFormat)
    BadTask(origin, "format", std::string("expected \"") + kTaskFormat + "\"");
  t.step = ParseStep(Field(body, "step", origin, json::value_t::string).get<std::string>(), origin + ": step");
  t.run = Field(body, "run", origin, json::value_t::string).get<std::string>();
  if (body.contains("module")) t.module = Field(body, "module", origin, json::value_t::string).get<std::string>();
  t.nam = Field(body, "nam", origin, json::value_t::string).get<std::string>();
  int64_t round = Field(body, "round", origin, json::value_t::number_integer).get<int64_t>();
  if (round < 1 || round > 1000000) BadTask(origin, "round", std::to_string(round) + " is out of range");
  t.round = static_cast<int>(round);
  try {
    t.pipeline = PipelineFromSource(Field(body, "pipeline", origin, json::value_t::object));
  } catch (const Error& e) {
    BadTask(origin, "pipeline", e.what());
  }
  if (body.contains("candidates")) {
    const json& cs = Field(body, "candidates", origin, json::value_t::array);
    for (size_t i = 0; i < cs.size(); ++i) {
      try {
        t.candidates.push_back(CandidateFromJson(cs[i]));
      } catch (const json::exception& e) {
        BadTask(origin, "candidates/" + std::to_string(i), e.what());
      }
    }
  }
  if (body.contains("kept")) {
    const json& ks = Field(body, "kept", origin, json::value_t::array);
    for (size_t i = 0; i < ks.size(); ++i) {
      std::string where = origin + ": kept/" + std::to_string(i);
      KeptModel k;
      k.candidate = Field(ks[i], "candidate", where, json::value_t::object);
      k.model = Field(ks[i], "model", where, json::value_t::string).get<std::string>();
      k.result = Field(ks[i], "result", where, json::value_t::string).get<std::string>();
      t.kept.push_back(std::move(k));
    }
  }
  if (body.contains("shards")) {
    t.shards = Field(body, "shards", origin, json::value_t::number_integer).get<int64_t>();
    if (t.shards < 1) BadTask(origin, "shards", "expected at least 1");
  }
  if (body.contains("rank_memory")) {  // evaluate, in a fine-tuning round whose module has memory
    t.rank_memory = Field(body, "rank_memory", origin, json::value_t::number_integer).get<int64_t>();
    if (t.rank_memory < 1) BadTask(origin, "rank_memory", "expected a positive number of bytes");
  }
  if (body.contains("farm")) {
    const auto farm = FarmKindFromName(Field(body, "farm", origin, json::value_t::string).get<std::string>());
    if (!farm) BadTask(origin, "farm", "expected \"counter\" or \"dispatcher\"");
    t.farm = *farm;
  }
  if (body.contains("top_k")) {
    t.top_k = Field(body, "top_k", origin, json::value_t::number_integer).get<int64_t>();
    if (t.top_k < 1) BadTask(origin, "top_k", "expected at least 1");
  }
  if (body.contains("metric")) t.metric = Field(body, "metric", origin, json::value_t::string).get<std::string>();
  if (body.contains("train")) t.train = TrainLayoutFromJson(body["train"], origin);
  if (body.contains("test")) t.test = Field(body, "test", origin, json::value_t::boolean).get<bool>();
  if (body.contains("gres")) t.gres = Field(body, "gres", origin, json::value_t::string).get<std::string>();
  if (body.contains("fpga")) t.fpga = FpgaConfigFromJson(body["fpga"], origin + ": fpga", "/");
  return t;
}

std::string TaskKey(const nlohmann::json& body) {
  nlohmann::json b = body;
  if (b.is_object()) b.erase("nam");
  return ChecksumHex(b.dump());
}

}  // namespace msaflow::workflow
