// Calibration: what earlier runs of a pipeline measured, read from their results.json ("costs"
// of each round) and journal.jsonl (each task's bytes to and from the NAM, the trained heads'
// sizes).
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>

#include "common/error.h"
#include "common/files.h"
#include "record/journal.h"
#include "simulate/simulate.h"

namespace msaflow::simulate {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

double Num(const json& j, const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct RunFigures {
  std::string dir;
  std::string launcher;
  double mtime = 0;
  std::vector<std::map<std::string, StepModel>> rounds;
  std::vector<double> round_s;
  std::vector<double> queue_s;  // Slurm: each round's wait in the queue
};

// "r3-train" -> (3, "train"); false for other task ids.
bool SplitTask(const std::string& id, int64_t* round, std::string* step) {
  if (id.size() < 4 || id[0] != 'r') return false;
  const size_t dash = id.find('-');
  if (dash == std::string::npos || dash == 1) return false;
  try {
    *round = std::stoll(id.substr(1, dash - 1));
  } catch (const std::exception&) {
    return false;
  }
  *step = id.substr(dash + 1);
  return true;
}

// One run's figures, or nothing when it is not a finished run of `pipeline` with costs.
bool ReadRun(const std::string& dir, const std::string& pipeline, RunFigures* out) {
  const std::string results = dir + "/results.json";
  if (!PathExists(results)) return false;
  json r = json::parse(ReadFile(results), nullptr, false);
  if (!r.is_object() || !r.contains("rounds") || !r["rounds"].is_array())
    Throw(ErrorKind::kCorrupt, results + ": not a run's results (expected an object with \"rounds\")");
  const json pl = r.value("pipeline", json());
  const std::string name = pl.is_object() ? pl.value("name", "") : pl.is_string() ? pl.get<std::string>() : "";
  if (name != pipeline) return false;
  out->dir = dir;
  out->mtime = static_cast<double>(fs::last_write_time(results).time_since_epoch().count());
  for (const auto& round : r["rounds"]) {
    if (!round.is_object() || !round.contains("costs") || !round["costs"].is_object()) return false;
    std::map<std::string, StepModel> steps;
    double total = 0;
    for (const auto& [step, c] : round["costs"].items()) {
      StepModel s;
      s.step = step;
      s.ranks = std::max<int64_t>(1, static_cast<int64_t>(Num(c, "ranks")));
      s.items = static_cast<int64_t>(Num(c, "items"));
      s.per_item_s = s.items > 0 ? Num(c, "work_s") / static_cast<double>(s.items) : 0;
      s.serial_s = Num(c, "serial_s");
      s.measured_s = Num(c, "wall_s");
      total += s.measured_s;
      steps[step] = s;
    }
    if (round.contains("node_seconds") && round["node_seconds"].is_object() && round["node_seconds"].contains("queue_s"))
      out->queue_s.push_back(Num(round["node_seconds"], "queue_s"));
    out->rounds.push_back(std::move(steps));
    out->round_s.push_back(total);
  }
  // Bytes to and from the NAM, and the heads' size, from the tasks' ends.
  const std::string jpath = dir + "/journal.jsonl";
  if (PathExists(jpath)) {
    const record::Journal j = record::ReadJournal(jpath);
    for (const auto& e : j.events) {
      if (e.event == "run-start") out->launcher = e.fields.value("launcher", "");
      if (e.event != "task-end" || e.fields.value("status", "") != "ok") continue;
      int64_t round = 0;
      std::string step;
      if (!SplitTask(e.fields.value("task", ""), &round, &step) || round < 1 ||
          round > static_cast<int64_t>(out->rounds.size()))
        continue;
      auto& rs = out->rounds[static_cast<size_t>(round - 1)];
      auto it = rs.find(step);
      if (it == rs.end()) continue;
      StepModel& s = it->second;
      s.nam_in_bytes = s.nam_out_bytes = 0;  // a retried task: its last end counts
      for (const auto& rk : e.fields.value("ranks", json::array())) {
        s.nam_in_bytes += Num(rk, "got_bytes");
        s.nam_out_bytes += Num(rk, "put_bytes");
      }
      if (step == "train") {
        double bytes = 0, n = 0;
        for (const auto& o : e.fields.value("outputs", json::array()))
          if (o.value("name", "").rfind("staging/", 0) == 0) bytes += Num(o, "size"), n += 1;
        if (n > 0) s.model_bytes = bytes / n;
      }
    }
  }
  return !out->rounds.empty();
}

}  // namespace

Calibration Calibrate(const std::string& from, const workflow::Pipeline& p) {
  if (!fs::is_directory(from)) Throw(ErrorKind::kNotFound, "--from-runs " + from + ": no such directory");
  std::vector<RunFigures> runs;
  RunFigures one;
  if (PathExists(from + "/results.json")) {
    if (ReadRun(from, p.name, &one)) runs.push_back(std::move(one));
  } else {
    std::vector<std::string> dirs;
    for (const auto& e : fs::directory_iterator(from))
      if (e.is_directory()) dirs.push_back(e.path().string());
    std::sort(dirs.begin(), dirs.end());
    for (const auto& d : dirs) {
      RunFigures f;
      if (ReadRun(d, p.name, &f)) runs.push_back(std::move(f));
    }
  }
  if (runs.empty())
    Throw(ErrorKind::kNotFound, "--from-runs " + from + ": no finished run of pipeline '" + p.name +
                                    "' with measured costs there (run it once: `msaflow run`)");
  std::stable_sort(runs.begin(), runs.end(), [](const RunFigures& a, const RunFigures& b) { return a.mtime < b.mtime; });
  const RunFigures& latest = runs.back();
  Calibration c;
  for (const auto& r : runs) c.runs.push_back(r.dir);
  c.launcher = latest.launcher.empty() ? "local" : latest.launcher;
  c.measured_round_s = latest.round_s;
  c.rounds = latest.rounds;
  std::vector<double> queue;
  for (const auto& r : runs) queue.insert(queue.end(), r.queue_s.begin(), r.queue_s.end());
  c.queue_wait_s = Median(queue);
  // Pooled: work per item over every run and round; serial time by median over the runs, round
  // by round (round 1 loads and computes features, later ones mostly reuse them: their serial
  // parts differ).
  std::map<std::string, std::pair<double, double>> work;  // step -> (work_s, items)
  std::map<std::pair<size_t, std::string>, std::vector<double>> serial;
  for (const auto& r : runs)
    for (size_t k = 0; k < r.rounds.size(); ++k)
      for (const auto& [step, s] : r.rounds[k]) {
        work[step].first += s.per_item_s * static_cast<double>(s.items);
        work[step].second += static_cast<double>(s.items);
        serial[{k, step}].push_back(s.serial_s);
      }
  for (size_t k = 0; k < c.rounds.size(); ++k)
    for (auto& [step, s] : c.rounds[k]) {
      if (work[step].second > 0) s.per_item_s = work[step].first / work[step].second;
      s.serial_s = Median(serial[{k, step}]);
    }
  return c;
}

}  // namespace msaflow::simulate
