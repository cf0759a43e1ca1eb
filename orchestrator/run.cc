#include "orchestrator/run.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "nam/fabric_store.h"
#include "nam/server.h"
#include "nam/store.h"
#include "orchestrator/fpga_preflight.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "orchestrator/nam_process.h"
#include "orchestrator/placement.h"
#include "orchestrator/slurm.h"

namespace msaflow::orchestrator {
namespace {

using nlohmann::json;

}  // namespace

std::string NewRunId(const std::string& name) {
  std::time_t t = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y%m%d-%H%M%S", std::gmtime(&t));
  std::string clean;
  for (char c : name) clean.push_back((std::isalnum(static_cast<unsigned char>(c)) ? std::tolower(c) : '-'));
  std::mt19937 rng(std::random_device{}());
  return fmt::format("{}-{}-{:04x}", clean, ts, rng() & 0xffff);
}

namespace {

std::string Now() {
  std::time_t t = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return ts;
}

class Journal {
 public:
  explicit Journal(std::string path) : path_(std::move(path)) {
    AppendLineSynced(path_, json{{"format", kJournalFormat}, {"time", Now()}}.dump());
  }
  void Event(const std::string& event, json fields) {
    fields["event"] = event;
    fields["time"] = Now();
    AppendLineSynced(path_, fields.dump());
  }

 private:
  std::string path_;
};

}  // namespace

std::string RunPipeline(const Pipeline& p, const Machine& m, const RunOptions& opt, std::FILE* out,
                        Launcher* given_launcher) {
  std::string id = opt.run_id.empty() ? NewRunId(p.name) : opt.run_id;
  nam::ValidateObjectName(id);
  std::string dir = std::filesystem::absolute(opt.runs_dir + "/" + id).lexically_normal().string();
  if (PathExists(dir + "/journal.jsonl"))
    Throw(ErrorKind::kInvalidInput, "run directory " + dir + " already holds a run; choose another --run-id");
  std::string nam_uri = NamFor(p, m, opt.runs_dir);  // refuses a malformed NAM URI before anything is written
  FpgaPreflight(p, m);                               // and fpga "opencl" with no OpenCL device here
  workflow::CheckDatasets(p);                        // and labels or splits no model can be trained on
  workflow::CheckBackbones(p);                       // and models the prepare step could not feed
  MakeDirs(dir + "/tasks");
  MakeDirs(dir + "/logs");
  WriteFileAtomic(dir + "/pipeline.json", p.source.dump(2) + "\n");
  // The journal from the first moment: a run that fails to start says why in it.
  Journal journal(dir + "/journal.jsonl");
  journal.Event("run-start", {{"run", id}, {"pipeline", p.name}, {"machine", m.name}, {"launcher", m.launcher},
                             {"nam", nam_uri == "serve" ? std::string("a NAM server started for the run") : nam_uri}});
  if (m.launcher == "slurm" && !m.slurm.conf.empty())
    ::setenv("SLURM_CONF", m.slurm.conf.c_str(), 1);  // for the jobs' own srun, and the NAM's
  std::unique_ptr<NamServerProcess> nam_server;
  nlohmann::json nam_event;
  if (nam_uri == "serve") try {
    if (opt.msaflow_exe.empty()) Throw(ErrorKind::kInternal, "RunPipeline: no msaflow binary to start the NAM server");
    std::string persist = std::filesystem::absolute(opt.runs_dir + "/nam").lexically_normal().string();
    NamLaunch launch = NamLaunchFor(m, id, dir);
    nam_server = std::make_unique<NamServerProcess>(opt.msaflow_exe, m.nam, persist, dir + "/logs/nam-server.log",
                                                    dir + "/nam-server.json", launch);
    nam_uri = nam_server->uri();
    std::string where = fmt::format("pid {}", nam_server->pid());
    if (!nam_server->slurm_job().empty())
      where = fmt::format("Slurm job {} on {} node {}, srun pid {}", nam_server->slurm_job(), m.nam.module,
                          nam_server->node(), nam_server->pid());
    std::fprintf(out, "NAM server for this run: %s (%s, %s, persisting to %s)\n", nam_uri.c_str(), where.c_str(),
                 m.nam.capacity.c_str(), persist.c_str());
    nam_event = {{"uri", nam_uri}, {"pid", nam_server->pid()}, {"persist", persist}, {"capacity", m.nam.capacity},
                 {"module", m.nam.module}, {"slurm_job", nam_server->slurm_job()}, {"node", nam_server->node()}};
  } catch (const Error& e) {
    journal.Event("run-failed", {{"round", 0}, {"error", std::string("starting the NAM server: ") + e.what()}});
    throw;
  }
  auto store = nam::OpenStore(nam_uri);
  std::unique_ptr<Launcher> own_launcher;
  if (!given_launcher) {
    if (m.launcher == "slurm") {
      own_launcher = std::make_unique<SlurmLauncher>(m, opt.msaflow_exe, id, dir, std::make_unique<SlurmCli>(m.slurm.conf),
                                                     static_cast<int>(p.retries.max), p.retries.on);
    } else {
      own_launcher = std::make_unique<LocalLauncher>(opt.msaflow_exe);
    }
  }
  Launcher& launcher = given_launcher ? *given_launcher : *own_launcher;
  if (!nam_event.is_null()) journal.Event("nam-server", nam_event);
  std::fprintf(out, "run %s: pipeline %s on machine %s, NAM %s\n  run directory %s\n", id.c_str(), p.name.c_str(),
               m.name.c_str(), nam_uri.c_str(), dir.c_str());

  json results = {{"format", kResultsFormat}, {"run", id}, {"pipeline", p.name}, {"nam", nam_uri},
                  {"rounds", json::array()}};
  std::vector<Ranked> ranking;  // best first, over all rounds
  std::vector<KeptCandidate> kept;
  // Best test accuracy per backbone over all rounds (a raw-pixel backbone is the baseline).
  std::map<std::string, Ranked> bb_best;  // backbone -> its best candidate so far (any round)
  json per_bb = json::object();       // backbone -> its best accuracy on the selection split
  json per_bb_test = json::object();  // ... that candidate, with its test accuracy
  double best_so_far = -1;
  int stale = 0;
  std::string stop_reason = "max rounds reached";
  auto run_start = std::chrono::steady_clock::now();
  for (int round = 1; round <= p.rounds.max; ++round) {
    std::vector<Ranked> backbone_best;
    for (const auto& [bb, r] : bb_best) backbone_best.push_back(r);
    std::vector<Candidate> fresh = round == 1 ? FirstRound(p) : NextRound(p, round, ranking, backbone_best);
    RoundPlan plan = PlanRound(p, m, id, nam_uri, round, fresh, kept);
    std::map<std::string, std::string> files;
    for (const auto& t : plan.tasks) {
      std::string f = dir + "/tasks/" + t.id + ".json";
      WriteFileAtomic(f, t.body.dump(2) + "\n");
      files[t.id] = f;
    }
    std::fprintf(out, "\n== round %d/%lld: %zu new candidates, %zu kept ==\n", round,
                 static_cast<long long>(p.rounds.max), fresh.size(), kept.size());
    journal.Event("round-start", {{"round", round}, {"candidates", fresh.size()}});
    json step_seconds = json::object();  // each step's wall time, launch included
    // For node-seconds under Slurm: the mode the round's job(s) ran in, when they were
    // submitted, and the first step's start and the last step's end.
    std::string slurm_mode;
    std::optional<std::chrono::steady_clock::time_point> submitted, first_start;
    std::chrono::steady_clock::time_point last_end{};
    LaunchObserver obs;
    obs.on_start = [&](const Task& t) {
      if (!first_start) first_start = std::chrono::steady_clock::now();
      std::fprintf(out, "  %-8s on %-3s (%lld rank%s) ...\n", t.step.c_str(), t.module.c_str(),
                   static_cast<long long>(t.ranks), t.ranks > 1 ? "s" : "");
      std::fflush(out);
      journal.Event("task-start", {{"task", t.id}, {"module", t.module}, {"ranks", t.ranks}});
    };
    obs.on_line = [&](const Task&, const std::string& line) {
      std::fprintf(out, "      %s\n", line.c_str());
      std::fflush(out);
    };
    obs.on_event = [&](const std::string& ev, json fields) {
      if (ev == "slurm-job") {
        if (slurm_mode.empty()) {
          slurm_mode = fields.value("mode", "");
          submitted = std::chrono::steady_clock::now();
        }
        std::string comps;
        for (const auto& c : fields.at("components"))
          comps += (comps.empty() ? "" : ", ") + c.at("id").get<std::string>() + " " + c.at("module").get<std::string>() +
                   "@" + c.at("partition").get<std::string>();
        std::fprintf(out, "  slurm %s job %s: %s\n", fields.at("mode").get<std::string>().c_str(),
                     fields.at("job").get<std::string>().c_str(), comps.c_str());
      } else if (ev == "slurm-end") {
        std::fprintf(out, "  slurm jobs ended %s\n", fields.at("state").get<std::string>().c_str());
      } else if (ev == "slurm-retry") {
        std::fprintf(out, "  slurm-retry: %s\n", fields.value("message", "").c_str());
      }
      std::fflush(out);
      journal.Event(ev, std::move(fields));
    };
    obs.on_end = [&](const Task& t, double secs) {
      std::fprintf(out, "  %-8s done in %.1f s\n", t.step.c_str(), secs);
      journal.Event("task-end", {{"task", t.id}, {"seconds", secs}, {"status", "ok"}});
      step_seconds[t.step] = secs;
      last_end = std::chrono::steady_clock::now();
    };
    try {
      launcher.RunRound(plan, files, dir + "/logs", obs);
    } catch (const Error& e) {
      journal.Event("run-failed", {{"round", round}, {"error", e.what()}});
      throw;
    }
    json best = json::parse(store->Get(BestObject(id, round)).bytes);
    json prepared = json::parse(store->Get(PreparedObject(id, round)).bytes);
    // The evaluate farm's figures, without the task lists (they stay in the NAM object).
    json evaluation = json::parse(store->Get(workflow::EvaluatedObject(id, round)).bytes);
    for (auto& r : evaluation["per_rank"]) r.erase("task_ids");
    json training = json::parse(store->Get(workflow::TrainedObject(id, round)).bytes);
    // The round table.
    // The round table: metrics on the split candidates are selected on (validation).
    std::fprintf(out, "\n  %-8s %-12s %-42s %8s %8s   (%s)\n", "cand", "backbone", "head", "acc", "loss", p.select_on.c_str());
    for (const auto& e : best.at("all")) {
      Candidate c = CandidateFromJson(e.at("candidate"));
      bool is_new = e.at("round") == round;
      std::fprintf(out, "  %-8s %-12s %-42s %8.4f %8.4f%s\n", c.id.c_str(), c.backbone.c_str(),
                   HeadLabel(c.head).c_str(), e.at("accuracy").get<double>(), e.at("loss").get<double>(),
                   is_new ? "" : "  (kept)");
    }
    const json& champ = best.at("champion");
    double acc = champ.at("accuracy");
    std::fprintf(out, "  best of round %d: %s (%s) accuracy %.4f; features computed %zu, reused %zu%s\n", round,
                 champ.at("candidate").at("id").get<std::string>().c_str(),
                 champ.at("candidate").at("backbone").get<std::string>().c_str(), acc, prepared.at("computed").size(),
                 prepared.at("reused").size(),
                 prepared.at("computed").empty() ? " (no backbone ran this round)" : "");
    ranking.clear();
    kept.clear();
    for (const auto& e : best.at("all")) {
      ranking.push_back({CandidateFromJson(e.at("candidate")), e.at("accuracy"), e.at("model"), e.value("test", json())});
      const std::string bb = e.at("candidate").at("backbone");
      if (!per_bb.contains(bb) || per_bb[bb].get<double>() < e.at("accuracy").get<double>()) {
        per_bb[bb] = e.at("accuracy");
        bb_best[bb] = ranking.back();
        per_bb_test[bb] = {{"candidate", e.at("candidate").at("id")}, {p.select_on + "_accuracy", e.at("accuracy")}};
        if (e.contains("test")) per_bb_test[bb]["test_accuracy"] = e["test"].value("accuracy", 0.0);
      }
    }
    for (const auto& e : best.at("top_k"))
      kept.push_back({CandidateFromJson(e.at("candidate")), e.at("model"), e.at("result")});
    double gain = acc - best_so_far;
    json round_json = {{"round", round}, {"champion", champ}, {"top_k", best.at("top_k")},
                       {"candidates", best.at("all")}, {"features", prepared},
                       {"features_computed", prepared.at("computed").size()},
                       {"features_reused", prepared.at("reused").size()}, {"training", training}, {"evaluation", evaluation},
                       {"step_seconds", step_seconds},
                       {"selection", {{"device", best.value("device", "")}, {"fpga", best.value("fpga", json::object())}}}};
    // What each step cost per item, for `msaflow plan --ranks auto` (orchestrator/placement.h).
    json costs = json::object();
    for (const auto& [step, c] : MeasureRound(round_json, p)) costs[step] = ToJson(c);
    round_json["costs"] = costs;
    if (m.launcher == "slurm" && first_start) {
      const double round_s = std::chrono::duration<double>(last_end - *first_start).count();
      const double queue_s = submitted ? std::chrono::duration<double>(*first_start - *submitted).count() : 0;
      std::map<std::string, double> secs;
      for (const auto& [k, v] : step_seconds.items()) secs[k] = v.get<double>();
      const std::string mode = slurm_mode.empty() ? m.slurm.mode : slurm_mode;
      json ns = json::array();
      auto measured = MeasureNodeSeconds(secs, p, m, mode, round_s);
      for (const auto& n : measured)
        ns.push_back({{"module", n.module}, {"nodes", n.nodes}, {"held_s", n.held_s}, {"used_s", n.used_s}});
      round_json["node_seconds"] = {{"mode", mode}, {"round_s", round_s}, {"queue_s", queue_s}, {"modules", ns}};
      std::fprintf(out, "  %s\n", NodeSecondsSummary(measured, mode, plan.tasks.size(), std::max(queue_s, 0.5)).c_str());
    }
    results["rounds"].push_back(std::move(round_json));
    journal.Event("round-end", {{"round", round}, {"champion", champ.at("candidate").at("id")}, {"accuracy", acc}});
    if (best_so_far >= 0 && gain < p.rounds.min_delta) {
      ++stale;
    } else {
      stale = 0;
    }
    best_so_far = std::max(best_so_far, acc);
    if (round < p.rounds.max && stale >= p.rounds.patience) {
      stop_reason = fmt::format("no gain >= {} for {} round(s)", p.rounds.min_delta, stale);
      break;
    }
  }
  const Ranked& champ = ranking.at(0);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  results["champion"] = {{"candidate", ToJson(champ.candidate)}, {"accuracy", champ.metric}, {"model", champ.model},
                         {"selected_on", p.select_on}};
  // The run's result: the champion on the test split, which chose nothing (unless the pipeline
  // selects on test, and then the figure is optimistic and says so).
  const bool held_out = p.select_on != "test" && champ.test.is_object();
  const double result_acc = held_out ? champ.test.value("accuracy", 0.0) : champ.metric;
  results["champion"]["test"] = held_out ? champ.test : json{{"accuracy", champ.metric}};
  results["result"] = {{"split", "test"}, {"accuracy", result_acc}, {"selected_on", p.select_on},
                       {"optimistic", !held_out}};
  results["best_per_backbone"] = per_bb;
  results["best_per_backbone_on_test"] = per_bb_test;
  results["stop_reason"] = stop_reason;
  results["seconds"] = secs;
  WriteFileAtomic(dir + "/results.json", results.dump(2) + "\n");
  journal.Event("run-end", {{"champion", champ.candidate.id}, {"accuracy", champ.metric}, {"stop", stop_reason}});
  if (held_out) {
    std::fprintf(out, "\nchampion: %s — %s on %s, chosen on validation accuracy %.4f; test accuracy %.4f (the result; "
                      "the test split chose nothing) (model %s)\n",
                 champ.candidate.id.c_str(), HeadLabel(champ.candidate.head).c_str(), champ.candidate.backbone.c_str(),
                 champ.metric, result_acc, champ.model.c_str());
  } else {
    std::fprintf(out, "\nchampion: %s — %s on %s, test accuracy %.4f (model %s)\n"
                      "  note: selected on the test split (select_on \"test\"), so this accuracy is optimistic: the "
                      "same data chose the model\n",
                 champ.candidate.id.c_str(), HeadLabel(champ.candidate.head).c_str(), champ.candidate.backbone.c_str(),
                 champ.metric, champ.model.c_str());
  }
  std::fprintf(out, "best per backbone (%s accuracy%s):", p.select_on.c_str(), held_out ? "; test accuracy" : "");
  for (const auto& [k, v] : per_bb_test.items()) {
    std::fprintf(out, " %s %.4f", k.c_str(), v.at(p.select_on + "_accuracy").get<double>());
    if (held_out && v.contains("test_accuracy")) std::fprintf(out, " / %.4f", v["test_accuracy"].get<double>());
    std::fprintf(out, ";");
  }
  std::fprintf(out, "\nstopped: %s; %.1f s; results in %s/results.json\n", stop_reason.c_str(), secs, dir.c_str());
  return dir;
}

std::string LastResults(const std::string& runs_dir, const std::string& name) {
  std::string best;
  std::filesystem::file_time_type best_time{};
  std::error_code ec;
  for (std::filesystem::directory_iterator it(runs_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path f = it->path() / "results.json";
    std::error_code fe;
    const auto t = std::filesystem::last_write_time(f, fe);
    if (fe || (!best.empty() && t <= best_time)) continue;
    json r = json::parse(ReadFile(f.string()), nullptr, false);
    if (r.is_discarded() || !r.is_object() || !r.contains("format") || r["format"] != kResultsFormat ||
        !r.contains("pipeline") || r["pipeline"] != name)
      continue;
    best = f.string();
    best_time = t;
  }
  return best;
}

NamLaunch NamLaunchFor(const Machine& m, const std::string& run_id, const std::string& run_dir) {
  NamLaunch l;
  std::string host, port;
  nam::SplitHostPort(m.nam.listen, "machine " + m.name + ": /nam/listen", &host, &port);
  if (!nam::IsLoopbackHost(host)) {
    // Off loopback the server needs a token; the run directory is on the file system the
    // modules share, and only this user may read it.
    l.token_file = run_dir + "/nam-token";
    std::random_device rd;
    std::string token;
    for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", rd());
    WriteFileAtomic(l.token_file, token + "\n");
    if (::chmod(l.token_file.c_str(), 0600) != 0) ThrowErrno("chmod " + l.token_file);
  }
  if (m.nam.module.empty() || m.launcher != "slurm") return l;
  const ModuleSpec& s = m.Module(m.nam.module, "machine " + m.name + ": /nam/module");
  if (const char* group = std::getenv("MSAFLOW_NAM_HET_GROUP")) {
    // The coordinator was submitted with the NAM as a component of its own job.
    l.prefix = {"srun", std::string("--het-group=") + group, "--nodes=1", "--ntasks=1", "--mpi=none",
                "--kill-on-bad-exit=1"};
  } else {
    // Its own job on the module's nodes, for as long as this run lasts.
    l.prefix = {"srun", "--job-name=msaflow-" + run_id + "-nam", "--partition=" + s.partition, "--nodes=1",
                "--ntasks=1", "--time=" + s.time, "--mpi=none", "--kill-on-bad-exit=1"};
    if (!s.constraint.empty()) l.prefix.push_back("--constraint=" + s.constraint);
    l.own_allocation = true;
  }
  l.start_timeout_s = 300;  // an allocation may have to wait
  return l;
}

std::string NamFor(const Pipeline& p, const Machine& m, const std::string& runs_dir) {
  if (p.nam.rfind("fabric://", 0) == 0) {
    try {
      nam::ParseFabricUri(p.nam);  // host, port (1..65535), options: refused now, not at the first step
    } catch (const Error& e) {
      Throw(ErrorKind::kInvalidInput, "pipeline " + p.name + ": /nam: " + e.what());
    }
  }
  if (!p.nam.empty()) return p.nam;
  if (!m.nam.uri.empty()) return m.nam.uri;
  if (m.nam.serve) return "serve";
  return "file://" + std::filesystem::absolute(runs_dir + "/nam").lexically_normal().string();
}

void PrintStatus(const std::string& run_dir, std::FILE* out) {
  std::string text;
  if (!PathExists(run_dir + "/journal.jsonl") && PathExists(run_dir + "/submitted.json")) {
    json sub = json::parse(ReadFile(run_dir + "/submitted.json"), nullptr, false);
    if (sub.is_discarded()) Throw(ErrorKind::kCorrupt, run_dir + "/submitted.json: not JSON");
    std::fprintf(out, "run %s submitted as Slurm job %s; the coordinator has not started yet\n",
                 sub.value("run", "").c_str(), sub.value("job", "").c_str());
    SlurmCli cli(sub.value("slurm_conf", ""));
    for (const auto& c : ParseShowJob(cli.Show(sub.value("job", ""))))
      std::fprintf(out, "  coordinator job %s: %s %s\n", c.id.c_str(), c.state.c_str(), c.reason.c_str());
    return;
  }
  text = ReadFile(run_dir + "/journal.jsonl");
  std::vector<json> events;
  std::vector<size_t> lines;  // each event's line in the file
  size_t start = 0, lineno = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++lineno;
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded())
      Throw(ErrorKind::kCorrupt, run_dir + "/journal.jsonl:" + std::to_string(lineno) + ": not a JSON line");
    if (!j.is_object())
      Throw(ErrorKind::kCorrupt, run_dir + "/journal.jsonl:" + std::to_string(lineno) + ": not a JSON object");
    events.push_back(std::move(j));
    lines.push_back(lineno);
  }
  if (events.empty() || !events[0].contains("format") || events[0]["format"] != kJournalFormat)
    Throw(ErrorKind::kCorrupt, run_dir + "/journal.jsonl:1: expected format " + std::string(kJournalFormat));
  std::string state = "running (or interrupted)";
  // Slurm jobs: the components each round used and their last known states.
  std::map<std::string, json> components;  // component id -> last state
  for (size_t k = 0; k < events.size(); ++k) try {
    const json& e = events[k];
    std::string ev = e.value("event", "");
    if (ev == "run-start")
      std::fprintf(out, "run %s (pipeline %s, machine %s, launcher %s, NAM %s)\n", e.value("run", "").c_str(),
                   e.value("pipeline", "").c_str(), e.value("machine", "").c_str(), e.value("launcher", "local").c_str(),
                   e.value("nam", "").c_str());
    if (ev == "nam-server") {
      std::string where = e.value("slurm_job", "").empty()
                              ? fmt::format("pid {}", e.value("pid", 0))
                              : fmt::format("Slurm job {} on node {}", e.value("slurm_job", ""), e.value("node", ""));
      std::fprintf(out, "  NAM server %s (%s, persisting to %s)\n", e.value("uri", "").c_str(), where.c_str(),
                   e.value("persist", "").c_str());
    }
    if (ev == "round-start") std::fprintf(out, "  round %d:\n", e.at("round").get<int>());
    if (ev == "slurm-job") {
      std::string comps;
      for (const auto& c : e.at("components"))
        comps += (comps.empty() ? "" : ", ") + c.value("id", "") + " " + c.value("module", "") + "@" +
                 c.value("partition", "");
      std::fprintf(out, "    slurm %s job %s%s: %s\n", e.value("mode", "").c_str(), e.value("job", "").c_str(),
                   e.value("attempt", 0) ? fmt::format(" (attempt {})", e.value("attempt", 0) + 1).c_str() : "",
                   comps.c_str());
    }
    if (ev == "slurm-state")
      for (const auto& c : e.at("components")) components[c.value("id", "")] = c;
    if (ev == "slurm-end") {
      for (const auto& j : e.at("jobs"))
        for (const auto& c : j.at("components")) {
          components[c.value("id", "")] = c;
          std::fprintf(out, "      %-8s %-10s %-9s exit %d:%d  %s\n", c.value("id", "").c_str(),
                       c.value("partition", "").c_str(), c.value("state", "").c_str(), c.value("exit", 0),
                       c.value("signal", 0), c.value("nodes", "").c_str());
        }
      if (e.value("leftover_sruns_killed", 0) > 0)
        std::fprintf(out, "      %d leftover srun process(es) ended\n", e.value("leftover_sruns_killed", 0));
    }
    if (ev == "slurm-retry") std::fprintf(out, "    retried: %s\n", e.value("message", "").c_str());
    if (ev == "slurm-fallback")
      std::fprintf(out, "    Slurm refused the %s mode; fell back to %s: %s\n", e.value("from", "").c_str(),
                   e.value("to", "").c_str(), e.value("why", "").c_str());
    if (ev == "task-start") {
      state = "running task " + e.value("task", "");
      std::fprintf(out, "    step %-12s on %-3s %d rank(s) started\n", e.value("task", "").c_str(),
                   e.value("module", "").c_str(), e.value("ranks", 1));
    }
    if (ev == "task-end")
      std::fprintf(out, "    step %-12s done in %.1f s\n", e.value("task", "").c_str(), e.value("seconds", 0.0));
    if (ev == "round-end")
      std::fprintf(out, "    champion %s accuracy %.4f\n", e.at("champion").get<std::string>().c_str(),
                   e.at("accuracy").get<double>());
    if (ev == "run-failed") state = "failed: " + e.value("error", "");
    if (ev == "run-end")
      state = fmt::format("finished: champion {} accuracy {:.4f} ({})", e.value("champion", ""),
                          e.value("accuracy", 0.0), e.value("stop", ""));
  } catch (const json::exception& x) {
    // A field missing or of the wrong type: the journal was edited or damaged.
    Throw(ErrorKind::kCorrupt, run_dir + "/journal.jsonl:" + std::to_string(lines[k]) + ": a malformed '" +
                                   Printable(events[k].value("event", json("?")).dump(), 40) + "' event (" + x.what() + ")");
  }
  if (state.rfind("running", 0) == 0 && !components.empty()) {
    std::fprintf(out, "  Slurm components (last seen):\n");
    for (const auto& [id, c] : components)
      std::fprintf(out, "    %-8s %-10s %s\n", id.c_str(), c.value("partition", "").c_str(), c.value("state", "").c_str());
  }
  std::fprintf(out, "state: %s\n", state.c_str());
}

}  // namespace msaflow::orchestrator
