// Calibration: what earlier runs of a pipeline measured, read from their results ("costs"
// of each round) and journals (each task's bytes to and from the NAM, the trained heads'
// sizes).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "common/files.h"
#include "record/journal.h"
#include "record/run_dir.h"
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
  std::vector<std::map<workflow::Step, StepModel>> rounds;
  std::vector<double> round_s;
  std::vector<double> queue_s;  // Slurm: each round's wait in the queue
  // Slurm: per round, its mode and what its wall time (journal: round-start to round-end) had
  // beyond the queue wait and the steps' own seconds: job starts and ends, srun between steps.
  std::vector<std::optional<workflow::SlurmMode>> slurm_mode;
  std::vector<double> beyond_steps_s;
  // Slurm, chained rounds: from one job's step ending to the next job's step starting (the
  // dependent job's wait and start), each as the journal has it.
  std::vector<double> chain_gaps_s;
};

// "r3-train" -> (3, Step::kTrain) (orchestrator/planner.cc names tasks so); false for other task ids.
bool SplitTask(const std::string& id, int64_t* round, workflow::Step* step) {
  if (id.size() < 4 || id[0] != 'r') return false;
  const size_t dash = id.find('-');
  if (dash == std::string::npos || dash == 1) return false;
  try {
    *round = std::stoll(id.substr(1, dash - 1));
  } catch (const std::exception&) {
    return false;
  }
  const std::optional<workflow::Step> s = workflow::StepFromName(id.substr(dash + 1));
  if (!s) return false;
  *step = *s;
  return true;
}

void ReadJournalFigures(const std::string& jpath, RunFigures* out);

// One run's figures, or nothing when it is not a finished run of `pipeline` with costs.
bool ReadRun(const std::string& dir, const std::string& pipeline, RunFigures* out) {
  const std::string results = record::ResultsPath(dir);
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
    std::map<workflow::Step, StepModel> steps;
    double total = 0;
    for (const auto& [name, c] : round["costs"].items()) {
      const std::optional<workflow::Step> step = workflow::StepFromName(name);
      if (!step) Throw(ErrorKind::kCorrupt, results + ": costs: \"" + name + "\" is not a step");
      StepModel s;
      s.step = *step;
      s.ranks = std::max<int64_t>(1, static_cast<int64_t>(Num(c, "ranks")));
      s.items = static_cast<int64_t>(Num(c, "items"));
      s.per_item_s = s.items > 0 ? Num(c, "work_s") / static_cast<double>(s.items) : 0;
      s.serial_s = Num(c, "serial_s");
      s.measured_s = Num(c, "wall_s");
      s.size = static_cast<double>(s.items);
      if (s.step == workflow::Step::kTrain)
        for (const auto& cand : round.value("training", json::object()).value("candidates", json::array()))
          if (cand.contains("finetuned_weights")) s.finetunes = true;
      total += s.measured_s;
      steps[s.step] = s;
    }
    const bool slurm = round.contains("node_seconds") && round["node_seconds"].is_object() &&
                       round["node_seconds"].contains("queue_s");
    if (slurm) out->queue_s.push_back(Num(round["node_seconds"], "queue_s"));
    out->slurm_mode.push_back(slurm ? workflow::SlurmModeFromName(round["node_seconds"].value("mode", ""))
                                    : std::nullopt);
    out->rounds.push_back(std::move(steps));
    out->round_s.push_back(total);
  }
  ReadJournalFigures(record::JournalPath(dir), out);
  return !out->rounds.empty();
}

// From a run's journal: bytes to and from the NAM, the ranks per host and their threads, and the
// heads' size, from the tasks' ends; each Slurm round's time beyond its queue wait and steps, and
// a chained round's gaps between its jobs.
void ReadJournalFigures(const std::string& jpath, RunFigures* out) {
  out->beyond_steps_s.assign(out->rounds.size(), std::nan(""));  // NaN: not measured
  if (PathExists(jpath)) {
    const record::Journal j = record::ReadJournal(jpath);
    std::map<int64_t, double> started;
    std::map<int64_t, std::map<workflow::Step, std::pair<double, double>>> spans;  // round -> task -> (start, end)
    for (const auto& e : j.events) {
      if (e.kind == record::EventKind::kRunStart) out->launcher = e.fields.value("launcher", "");
      if ((e.kind == record::EventKind::kTaskStart || e.kind == record::EventKind::kTaskEnd) &&
          e.fields.contains("time") && e.fields["time"].is_string()) {
        int64_t round = 0;
        workflow::Step step{};
        if (SplitTask(e.fields.value("task", ""), &round, &step)) {
          auto& span = spans[round][step];
          (e.kind == record::EventKind::kTaskStart ? span.first : span.second) =
              record::ParseJournalTime(e.fields["time"].get<std::string>());
        }
      }
      if ((e.kind == record::EventKind::kRoundStart || e.kind == record::EventKind::kRoundEnd) &&
          e.fields.contains("time") && e.fields["time"].is_string() && e.fields.contains("round") &&
          e.fields["round"].is_number_integer()) {
        const int64_t round = e.fields["round"].get<int64_t>();
        const double t = record::ParseJournalTime(e.fields["time"].get<std::string>());
        if (e.kind == record::EventKind::kRoundStart) started[round] = t;
        if (e.kind == record::EventKind::kRoundEnd && started.count(round) && round >= 1 &&
            round <= static_cast<int64_t>(out->rounds.size())) {
          const auto k = static_cast<size_t>(round - 1);
          if (out->slurm_mode[k] && k < out->queue_s.size())
            out->beyond_steps_s[k] = t - started[round] - out->queue_s[k] - out->round_s[k];
          if (out->slurm_mode[k] == workflow::SlurmMode::kChained) {  // one job per step, each after the one before
            std::vector<std::pair<double, double>> by_start;
            for (const auto& [step, span] : spans[round])
              if (span.first > 0 && span.second > 0) by_start.push_back(span);
            std::sort(by_start.begin(), by_start.end());
            for (size_t i = 1; i < by_start.size(); ++i) {
              const double gap = by_start[i].first - by_start[i - 1].second;
              out->chain_gaps_s.push_back(std::max(0.0, gap));
              out->beyond_steps_s[k] -= std::max(0.0, gap);
            }
          }
        }
      }
      if (e.kind != record::EventKind::kTaskEnd || e.fields.value("status", "") != "ok") continue;
      int64_t round = 0;
      workflow::Step step{};
      if (!SplitTask(e.fields.value("task", ""), &round, &step) || round < 1 ||
          round > static_cast<int64_t>(out->rounds.size()))
        continue;
      auto& rs = out->rounds[static_cast<size_t>(round - 1)];
      auto it = rs.find(step);
      if (it == rs.end()) continue;
      StepModel& s = it->second;
      s.nam_in_bytes = s.nam_out_bytes = 0;  // a retried task: its last end counts
      std::map<std::string, int64_t> per_host;
      s.threads = 0;
      for (const auto& rk : e.fields.value("ranks", json::array())) {
        s.nam_in_bytes += Num(rk, "got_bytes");
        s.nam_out_bytes += Num(rk, "put_bytes");
        ++per_host[rk.value("host", "")];
        if (const auto t = static_cast<int64_t>(Num(rk, "threads")); t > 0) s.threads = s.threads ? std::min(s.threads, t) : t;
      }
      for (const auto& [host, n] : per_host) s.per_node = std::max(s.per_node, n);
      s.size = step == workflow::Step::kEvaluate && s.nam_in_bytes > 0 ? s.nam_in_bytes : static_cast<double>(s.items);
      if (step == workflow::Step::kTrain) {
        double bytes = 0, n = 0;
        for (const auto& o : e.fields.value("outputs", json::array()))
          if (o.value("name", "").rfind("staging/", 0) == 0) bytes += Num(o, "size"), n += 1;
        if (n > 0) s.model_bytes = bytes / n;
      }
    }
  }
}

}  // namespace

Calibration Calibrate(const std::string& from, const workflow::Pipeline& p, bool nodes_share_cores) {
  if (!fs::is_directory(from)) Throw(ErrorKind::kNotFound, "--from-runs " + from + ": no such directory");
  std::vector<RunFigures> runs;
  RunFigures one;
  if (record::HasResults(from)) {
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
  std::vector<double> queue, overhead;
  for (const auto& r : runs) queue.insert(queue.end(), r.queue_s.begin(), r.queue_s.end());
  c.queue_wait_s = Median(queue);
  // What a Slurm job costs beyond its queue wait and its steps: a hetjob round is one job; a
  // chained round one per step, the first like a hetjob's and each later one after the gap from
  // the step before (taken out of its round's figure above).
  std::vector<double> gaps;
  for (const auto& r : runs) {
    gaps.insert(gaps.end(), r.chain_gaps_s.begin(), r.chain_gaps_s.end());
    for (size_t k = 0; k < r.rounds.size() && k < r.beyond_steps_s.size(); ++k)
      if (!std::isnan(r.beyond_steps_s[k])) overhead.push_back(std::max(0.0, r.beyond_steps_s[k]));
  }
  if (!gaps.empty()) c.chain_wait_s = Median(gaps);
  c.job_overhead_s = Median(overhead);
  // Work in core-seconds (rank-seconds times the threads each rank had: its share of the cores
  // it shared with other ranks, parallel/mpi_comm.cc), fitted per step over every run and round as fixed + per-unit x size,
  // the size being what the work grows with (items: image passes, training updates; for
  // evaluate the bytes of features it read, as its tasks do not grow with the data). With one
  // size only, all of it is taken as growing with the size. Serial time by median over the runs,
  // round by round (round 1 loads and computes features, later ones mostly reuse them) and for
  // one rank apart from several (those start through mpirun).
  c.cores = std::max(1u, std::thread::hardware_concurrency());
  // A fine-tuning round's train step is fitted apart: an update there costs a tail's passes, a
  // hundred times a head's.
  auto fit_key = [](const StepModel& s) { return std::make_pair(s.step, s.finetunes); };
  using FitKey = std::pair<workflow::Step, bool>;                   // (step, fine-tunes)
  std::map<FitKey, std::vector<std::pair<double, double>>> points;  // fit_key -> (size, core-seconds)
  std::map<std::tuple<size_t, workflow::Step, bool>, std::vector<double>> serial;
  for (const auto& r : runs)
    for (size_t k = 0; k < r.rounds.size(); ++k)
      for (const auto& [step, s] : r.rounds[k]) {
        // The threads its ranks had as recorded; else the node's cores over its ranks there (on
        // nodes sharing this machine's cores, a step's ranks shared them all).
        const int64_t per_node = nodes_share_cores || s.per_node <= 0 ? s.ranks : s.per_node;
        const double threads = static_cast<double>(s.threads > 0 ? s.threads : std::max<int64_t>(1, c.cores / per_node));
        if (s.size > 0) points[fit_key(s)].push_back({s.size, s.per_item_s * threads * static_cast<double>(s.items)});
        serial[{k, step, s.ranks > 1}].push_back(s.serial_s);
      }
  std::map<FitKey, std::pair<double, double>> fit;  // fit_key -> (fixed, per unit of size)
  for (const auto& [key, pts] : points) {
    double sx = 0, sy = 0, sxx = 0, sxy = 0, lo = pts[0].first, hi = pts[0].first;
    for (const auto& [x, y] : pts) sx += x, sy += y, sxx += x * x, sxy += x * y, lo = std::min(lo, x), hi = std::max(hi, x);
    const double n = static_cast<double>(pts.size());
    // A line only through sizes far enough apart (rounds of one run differ a little, and noise
    // then makes a steep slope), and only one that stays positive: a negative intercept or slope
    // falls back to proportional work, or to fixed work.
    double a = 0, b = sx > 0 ? sy / sx : 0;
    if (hi > lo * 1.5) {
      const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), intercept = (sy - slope * sx) / n;
      if (slope <= 0)
        a = sy / n, b = 0;
      else if (intercept >= 0)
        a = intercept, b = slope;
    }
    fit[key] = {a, b};
  }
  for (size_t k = 0; k < c.rounds.size(); ++k)
    for (auto& [step, s] : c.rounds[k]) {
      s.fixed_core_s = s.size > 0 ? fit[fit_key(s)].first : 0;
      s.per_item_s = fit[fit_key(s)].second;
      for (const bool many : {s.ranks > 1, s.ranks <= 1})  // as run, else the other kind
        if (auto it = serial.find({k, step, many}); it != serial.end()) {
          s.serial_s = Median(it->second);
          break;
        }
      s.serial_by_ranks[false] = serial.count({k, step, false}) ? Median(serial[{k, step, false}]) : s.serial_s;
      s.serial_by_ranks[true] = serial.count({k, step, true}) ? Median(serial[{k, step, true}]) : s.serial_s;
    }
  return c;
}

}  // namespace msaflow::simulate
