// msaflow: the command-line front end. Exit codes (docs/cli.md):
//   0 success · 1 a task or run failed · 2 usage error · 3 invalid input · 4 not found
//   5 corrupt data · 6 unsupported · 7 I/O error · 8 NAM unavailable · 9 NAM full · 70 internal
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <iostream>
#include <iterator>
#include <cstdio>
#include <filesystem>
#include <fmt/core.h>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "common/version.h"
#include "modules/steps.h"
#include "parallel/mpi_comm.h"
#include "nam/fabric_store.h"
#include "nam/pool.h"
#include "nam/server.h"
#include "nam/store.h"
#include "nam/verify.h"
#include "orchestrator/fpga_preflight.h"
#include "workflow/backbones.h"
#include "workflow/datasets.h"
#include "orchestrator/launcher.h"
#include "orchestrator/machine.h"
#include "orchestrator/placement.h"
#include "orchestrator/planner.h"
#include "orchestrator/run.h"
#include "orchestrator/scaling.h"
#include "orchestrator/slurm.h"
#include "orchestrator/journal.h"
#include "orchestrator/status.h"
#include "orchestrator/why.h"

namespace {

using namespace msaflow;

int ExitCode(ErrorKind k) {
  switch (k) {
    case ErrorKind::kTaskFailed: return 1;
    case ErrorKind::kInvalidInput: return 3;
    case ErrorKind::kNotFound: return 4;
    case ErrorKind::kCorrupt: return 5;
    case ErrorKind::kUnsupported: return 6;
    case ErrorKind::kIo: return 7;
    case ErrorKind::kUnavailable: return 8;
    case ErrorKind::kCapacity: return 9;
    case ErrorKind::kInternal: return 70;
  }
  return 70;
}

std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) Throw(ErrorKind::kIo, "cannot resolve /proc/self/exe: " + ec.message());
  return p.string();
}

// "a,b,c" -> {"a", "b", "c"}; an empty item is a usage error naming the option.
std::vector<std::string> SplitList(const std::string& s, const std::string& option) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(start, end - start);
    if (item.empty()) Throw(ErrorKind::kInvalidInput, option + ": \"" + s + "\" has an empty item");
    out.push_back(item);
    start = end + 1;
  }
  return out;
}

std::atomic<bool> g_stop{false};
void OnStopSignal(int) { g_stop.store(true); }

std::string NamUri(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* e = std::getenv("MSAFLOW_NAM"); e && *e) return e;
  Throw(ErrorKind::kInvalidInput, "no NAM given: pass --nam URI (fabric://HOST:PORT, file://DIR) or set MSAFLOW_NAM");
}

void PrintInfo(const nam::ObjectInfo& i) {
  nlohmann::json j = {{"name", i.name}, {"size", i.size}, {"checksum", i.checksum}, {"version", i.version}, {"meta", i.meta}};
  std::printf("%s\n", j.dump(2).c_str());
}

// `msaflow module STEP --task FILE`: one rank of a step. MPI is initialised here (a process
// started without mpirun or srun is rank 0 of 1); an error on any rank ends every rank, so none
// is left waiting in a collective.
int RunModule(const std::string& step, const std::string& task_file, int* argc, char*** argv) {
  parallel::MpiSession mpi(argc, argv);
  parallel::Comm& world = mpi.world();
  try {
    std::string text = ReadFile(task_file);
    nlohmann::json task = nlohmann::json::parse(text, nullptr, false);
    if (task.is_discarded()) Throw(ErrorKind::kInvalidInput, task_file + ": not valid JSON");
    // Under Slurm, say where this rank runs: the launch modes are checked by it, and users
    // read it when a node misbehaves.
    if (const char* node = std::getenv("SLURMD_NODENAME")) {
      const char* job = std::getenv("SLURM_JOB_ID");
      const char* st = std::getenv("SLURM_STEP_ID");
      std::printf("rank %d/%d on node %s (Slurm job %s, step %s), %d thread%s\n", world.rank(), world.size(), node,
                  job ? job : "?", st ? st : "?", mpi.threads(), mpi.threads() > 1 ? "s" : "");
      std::fflush(stdout);
    }
    modules::RunStep(step, task, world, stdout);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "msaflow: error: %s%s\n", world.size() > 1 ? fmt::format("[rank {}] ", world.rank()).c_str() : "",
                 e.what());
    std::fflush(stderr);
    mpi.AbortIfParallel(ExitCode(e.kind()));
    return ExitCode(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "msaflow: internal error: %s\n", e.what());
    std::fflush(stderr);
    mpi.AbortIfParallel(70);
    return 70;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"msaflow — transfer-learning workflows on a Modular Supercomputer Architecture"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("msaflow ") + kVersion);

  std::string pipeline_path, machine_override, runs_dir = "runs", run_id, task_file, run_dir, step;
  auto* validate = app.add_subcommand("validate", "Check a pipeline JSON; print a summary or the first error");
  validate->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();

  auto* plan = app.add_subcommand("plan", "Print the plan of round 1: tasks, modules, ranks and commands");
  plan->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();
  plan->add_option("--machine", machine_override, "machine name or file (overrides the pipeline's)");
  std::string launcher_override;
  plan->add_option("--launcher", launcher_override, "local: commands per rank; slurm: the exact batch script of round 1")
      ->check(CLI::IsMember({"local", "slurm"}));
  plan->add_option("--runs", runs_dir, "directory holding run directories")->capture_default_str();
  std::string ranks_choice = "pipeline";
  plan->add_option("--ranks", ranks_choice,
                   "pipeline: the ranks the pipeline names; auto: ranks per step from the last run's measured costs "
                   "and the machine's limits, with the reason for each")
      ->check(CLI::IsMember({"pipeline", "auto"}))
      ->capture_default_str();

  bool wait = false;
  auto* submit = app.add_subcommand("submit", "Submit a run to Slurm: its coordinator becomes a job on the cm module");
  submit->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();
  submit->add_option("--machine", machine_override, "machine file with launcher slurm (overrides the pipeline's)");
  submit->add_option("--runs", runs_dir, "directory holding run directories")->capture_default_str();
  submit->add_option("--run-id", run_id, "run id (default: <name>-<time>-<random>)");
  submit->add_flag("--wait", wait, "follow the run to its end, with progress; exit 1 unless it completes");

  auto* run = app.add_subcommand("run", "Run a pipeline on this machine (blocking, with progress)");
  run->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();
  run->add_option("--runs", runs_dir, "directory holding run directories and the default NAM")->capture_default_str();
  run->add_option("--run-id", run_id, "run id (default: <name>-<time>-<random>)");
  run->add_option("--machine", machine_override, "machine name or file (overrides the pipeline's)");
  run->add_option("--ranks", ranks_choice, "pipeline | auto (as for plan)")
      ->check(CLI::IsMember({"pipeline", "auto"}))
      ->capture_default_str();

  orchestrator::ScalingOptions scaling_opt;
  std::string scaling_ranks = "1,2", scaling_steps = "prepare,train,evaluate", scaling_modes;
  auto* scaling = app.add_subcommand("scaling", "Strong or weak scaling of a pipeline's steps: a table of time, "
                                                "speed-up and efficiency per step and training mode");
  scaling->add_option("pipeline", pipeline_path, "pipeline JSON file")->required();
  scaling->add_option("--ranks", scaling_ranks, "rank counts, e.g. 1,2,4")->capture_default_str();
  scaling->add_flag("--weak", scaling_opt.weak, "grow the datasets' limits with the ranks (default: strong scaling)");
  scaling->add_option("--steps", scaling_steps, "steps to scale: prepare,train,evaluate")->capture_default_str();
  scaling->add_option("--modes", scaling_modes, "training modes to compare, e.g. sync,async,hybrid (default: the pipeline's)");
  scaling->add_option("--runs", runs_dir, "directory for the study")->capture_default_str();
  scaling->add_option("--machine", machine_override, "machine name or file (overrides the pipeline's)");

  auto* status = app.add_subcommand("status", "Show the state of a run directory; exit 0 finished, 1 failed or "
                                              "interrupted, 75 still running");
  status->add_option("run_dir", run_dir, "runs/<id>")->required();

  std::string why_task;
  auto* why = app.add_subcommand("why", "Say whether a task of a run ran or was reused, and what changed since the "
                                        "last run that had it");
  why->add_option("run_dir", run_dir, "runs/<id>")->required();
  why->add_option("task", why_task, "task id, r<round>-<step> (e.g. r1-prepare)")->required();

  auto* resume = app.add_subcommand("resume", "Continue a run whose coordinator died or failed: what finished is "
                                              "reused, the rest runs");
  resume->add_option("run_dir", run_dir, "runs/<id>")->required();

  auto* module = app.add_subcommand("module", "Run one step of a round as a module process (what launchers start)");
  module->add_option("step", step, "load | prepare | train | store | evaluate | select")
      ->required()
      ->check(CLI::IsMember({"load", "prepare", "train", "store", "evaluate", "select"}));
  module->add_option("--task", task_file, "task JSON written by the planner")->required()->check(CLI::ExistingFile);

  auto* nam_cmd = app.add_subcommand("nam", "The NAM: serve it, or put/get/stat/ls/rm objects by hand");
  nam_cmd->require_subcommand(1);
  nam::ServerOptions sopt;
  std::string capacity = "1GiB";
  bool no_map = false;
  auto* serve = nam_cmd->add_subcommand("serve", "Run a NAM server (until SIGTERM or SIGINT)");
  serve->add_option("--listen", sopt.listen, "HOST:PORT (port 0 picks a free one; host * is this node's name)")->capture_default_str();
  serve->add_option("--capacity", capacity, "memory pool size (e.g. 512MiB, 4GiB)")->capture_default_str();
  serve->add_option("--persist", sopt.persist_dir, "write committed objects through to DIR; reload them on start");
  serve->add_option("--token-file", sopt.token_file, "clients must present this token (required off loopback)");
  serve->add_option("--provider", sopt.provider, "libfabric provider: tcp (tcp;ofi_rxm), shm, or a full name")
      ->capture_default_str();
  serve->add_option("--users-lock", sopt.users_lock,
                    "stop once no process holds a shared lock on FILE (runs sharing this server hold one)");
  serve->add_option("--lock-wait", sopt.lock_wait_s, "seconds to wait for another server to let go of --persist DIR")
      ->capture_default_str();
  serve->add_option("--ready-file", sopt.ready_file, "write {uri, pid} here once serving; removed on exit");
  serve->add_option("--lease", sopt.lease_s, "seconds before a silent client's session is dropped")->capture_default_str();
  serve->add_flag("--no-map", no_map, "never let same-node clients map the pool (bytes move by RMA only)");
  serve->add_flag("--verbose", sopt.verbose, "log every request");

  std::string nam_uri, obj_name, obj_file, meta_text, out_file, prefix;
  bool as_json = false;
  auto add_nam = [&](CLI::App* c) {
    c->add_option("--nam", nam_uri, "NAM URI (default: $MSAFLOW_NAM)");
  };
  auto* nput = nam_cmd->add_subcommand("put", "Store a file (or stdin) as an object");
  nput->add_option("name", obj_name, "object name")->required();
  nput->add_option("file", obj_file, "file to store ('-' or absent: stdin)");
  nput->add_option("--meta", meta_text, "metadata, a JSON object");
  add_nam(nput);
  auto* nget = nam_cmd->add_subcommand("get", "Fetch an object's bytes (checksum verified)");
  nget->add_option("name", obj_name, "object name")->required();
  nget->add_option("-o,--output", out_file, "write here (atomically) instead of stdout");
  add_nam(nget);
  auto* nstat = nam_cmd->add_subcommand("stat", "Show an object's size, checksum, version and metadata");
  nstat->add_option("name", obj_name, "object name")->required();
  add_nam(nstat);
  auto* nls = nam_cmd->add_subcommand("ls", "List objects by name prefix");
  nls->add_option("prefix", prefix, "name prefix");
  nls->add_flag("--json", as_json, "one JSON object per line");
  add_nam(nls);
  auto* nrm = nam_cmd->add_subcommand("rm", "Remove an object");
  nrm->add_option("name", obj_name, "object name")->required();
  add_nam(nrm);
  auto* ndf = nam_cmd->add_subcommand("df", "Show a NAM server's capacity and use");
  add_nam(ndf);
  bool repair = false;
  auto* nverify = nam_cmd->add_subcommand("verify", "Read every object, check every checksum, list the damaged ones");
  nverify->add_flag("--repair", repair, "move the damaged objects aside (DIR/DAMAGED/), so reads say 'no object'");
  add_nam(nverify);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  try {
    if (*validate) {
      workflow::Pipeline p = workflow::LoadPipeline(pipeline_path);
      orchestrator::Machine m = orchestrator::LoadMachine(p.machine);
      for (const auto& s : workflow::StepNames()) m.Module(p.steps.at(s).module, pipeline_path + ": /steps/" + s + "/module");
      for (const auto& b : p.backbones)
        if (b.kind == "onnx" && !PathExists(b.onnx))
          Throw(ErrorKind::kNotFound, pipeline_path + ": /backbones: " + b.onnx + ": no such file");
      workflow::CheckDatasetFiles(p, pipeline_path);  // without reading them
      workflow::CheckBackbones(p);                    // the models' operators, feature layers and inputs
      orchestrator::NamFor(p, m, runs_dir);  // the NAM URI as a run would use it
      orchestrator::FpgaPreflight(p, m);     // fpga "opencl" needs an OpenCL device here (launcher local)
      // The train layout against the machine (ranks + servers within the module's max_ranks).
      const auto& train = p.steps.at("train");
      auto layout = orchestrator::ResolveTrainLayout(p, train, m.Module(train.module, "/steps/train/module"),
                                                     static_cast<size_t>(p.rounds.candidates));
      std::printf("%s: valid (%zu backbones, up to %lld rounds of %lld candidates, machine %s)\n", pipeline_path.c_str(),
                  p.backbones.size(), static_cast<long long>(p.rounds.max), static_cast<long long>(p.rounds.candidates),
                  m.name.c_str());
      std::printf("  train: mode %s on %lld rank%s%s\n", layout.mode.c_str(), static_cast<long long>(layout.ranks),
                  layout.ranks > 1 ? "s" : "",
                  layout.servers ? fmt::format(" + {} parameter server(s)", layout.servers).c_str() : "");
      for (const char* step : {"prepare", "select"}) {
        const auto& mod = m.Module(p.steps.at(step).module, "");
        std::printf("  %s: fpga \"%s\" on module %s\n", step, orchestrator::FpgaFor(p, mod).backend.c_str(), mod.name.c_str());
      }
      return 0;
    }
    if (*plan || *run) {
      workflow::Pipeline p = workflow::LoadPipeline(pipeline_path);
      orchestrator::Machine m = orchestrator::LoadMachine(machine_override.empty() ? p.machine : machine_override);
      orchestrator::LocalLauncher launcher(SelfExe());
      if (!launcher_override.empty()) m.launcher = launcher_override;
      if (ranks_choice == "auto") {
        // A user who knows nothing of parallel computing: ranks from what the last run measured.
        const unsigned cores = std::thread::hardware_concurrency();
        const std::string last = orchestrator::LastResults(runs_dir, p.name);
        orchestrator::Placement pl;
        if (last.empty()) {
          pl = orchestrator::PlaceWithoutCosts(p, m, cores);
        } else {
          nlohmann::json results = nlohmann::json::parse(ReadFile(last), nullptr, false);
          if (results.is_discarded()) Throw(ErrorKind::kCorrupt, last + ": not JSON");
          pl = orchestrator::PlaceFromCosts(p, m, results, last, cores);
        }
        std::printf("%sranks from measured costs: %s\n", m.launcher == "slurm" && *plan ? "# " : "", pl.source.c_str());
        for (const auto& line : pl.why) std::printf("%s  %s\n", m.launcher == "slurm" && *plan ? "# " : "", line.c_str());
        p = orchestrator::ApplyPlacement(std::move(p), pl);
      }
      if (*plan && m.launcher == "slurm") {
        std::string nam = orchestrator::NamFor(p, m, runs_dir);
        if (nam == "serve") {
          nam = "fabric://<NAM server started for the run>";
          if (!m.nam.module.empty())
            std::printf("# NAM server: srun msaflow nam serve on module %s (partition %s), a job of its own under "
                        "`msaflow run`, a component of the coordinator's job under `msaflow submit`\n",
                        m.nam.module.c_str(), m.Module(m.nam.module, "nam").partition.c_str());
          else
            std::printf("# NAM server: msaflow nam serve, started by the coordinator where it runs\n");
        }
        std::string runs_abs = std::filesystem::absolute(runs_dir).lexically_normal().string();
        std::string rd = runs_abs + "/<run-id>";
        auto rp = orchestrator::PlanRound(p, m, "<run-id>", nam, 1, workflow::FirstRound(p), {});
        std::map<std::string, std::string> files;
        for (const auto& t : rp.tasks) files[t.id] = rd + "/tasks/" + t.id + ".json";
        orchestrator::SlurmScriptParams sp{"<run-id>", rd, rd + "/logs", rd + "/slurm/round-1.0.progress", SelfExe(), 1};
        if (m.slurm.mode == "chained") {
          for (const auto& t : rp.tasks) {
            std::printf("# --- job for %s%s\n", t.id.c_str(),
                        t.after.empty() ? "" : " (sbatch --dependency=afterok:<previous> --kill-on-invalid-dep=yes)");
            std::printf("%s", orchestrator::ChainedScript(t, m, files, sp).c_str());
          }
        } else if (m.slurm.mode == "single") {
          std::printf("%s", orchestrator::SingleScript(rp.tasks, m, files, sp).c_str());
        } else {
          std::printf("%s", orchestrator::HetjobScript(rp.tasks, m, files, sp).c_str());
        }
        return 0;
      }
      if (*plan) {
        std::string nam = orchestrator::NamFor(p, m, runs_dir);
        if (nam == "serve")
          nam = "fabric://<started for the run: " + m.nam.provider + " on " + m.nam.listen + ", " + m.nam.capacity +
                ", persisting to " + std::filesystem::absolute(runs_dir + "/nam").lexically_normal().string() + ">";
        auto rp = orchestrator::PlanRound(p, m, "<run-id>", nam, 1, workflow::FirstRound(p), {});
        std::printf("plan for %s on machine %s (launcher %s), NAM %s\n", p.name.c_str(), m.name.c_str(),
                    m.launcher.c_str(), nam.c_str());
        std::printf("round 1 of up to %lld; later rounds: %lld candidates by strategy '%s', top %lld kept\n",
                    static_cast<long long>(p.rounds.max), static_cast<long long>(p.rounds.candidates),
                    p.rounds.strategy.c_str(), static_cast<long long>(p.rounds.top_k));
        for (const auto& t : rp.tasks) {
          std::printf("  %-12s module %-3s ranks %lld%s\n", t.id.c_str(), t.module.c_str(), static_cast<long long>(t.ranks),
                      t.after.empty() ? "" : ("  after " + t.after[0]).c_str());
          auto cmd = launcher.Command(t, "runs/<run-id>/tasks/" + t.id + ".json");
          std::string line;
          for (const auto& a : cmd) line += (line.empty() ? "" : " ") + a;
          std::printf("      %s%s\n", t.ranks > 1 ? fmt::format("{} x ", t.ranks).c_str() : "", line.c_str());
        }
        std::printf("candidates of round 1:\n");
        for (const auto& c : workflow::FirstRound(p))
          std::printf("  %-8s %-12s %s seed %llu\n", c.id.c_str(), c.backbone.c_str(),
                      workflow::HeadLabel(c.head).c_str(), static_cast<unsigned long long>(c.head.seed));
        return 0;
      }
      orchestrator::RunOptions opt;
      opt.runs_dir = runs_dir;
      opt.run_id = run_id;
      opt.msaflow_exe = SelfExe();
      orchestrator::InstallInterruptHandlers();  // Ctrl-C / scancel of the coordinator: end what it started
      orchestrator::RunPipeline(p, m, opt, stdout);
      return 0;
    }
    if (*serve) {
      sopt.capacity = nam::ParseSize(capacity, "--capacity");
      sopt.allow_map = !no_map;
      struct sigaction sa {};
      sa.sa_handler = OnStopSignal;
      sigaction(SIGTERM, &sa, nullptr);
      sigaction(SIGINT, &sa, nullptr);
      nam::Server server(sopt);
      server.Run(g_stop);
      return 0;
    }
    if (*nput) {
      std::string bytes;
      if (obj_file.empty() || obj_file == "-") {
        bytes.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      } else {
        bytes = ReadFile(obj_file);
      }
      nlohmann::json meta = nlohmann::json::object();
      if (!meta_text.empty()) {
        meta = nlohmann::json::parse(meta_text, nullptr, false);
        if (meta.is_discarded() || !meta.is_object())
          Throw(ErrorKind::kInvalidInput, "--meta: expected a JSON object, got '" + meta_text + "'");
      }
      auto store = nam::OpenStore(NamUri(nam_uri));
      auto info = store->Put(obj_name, bytes, meta);
      std::printf("put %s: %llu bytes, version %llu, checksum %s\n", info.name.c_str(),
                  static_cast<unsigned long long>(info.size), static_cast<unsigned long long>(info.version),
                  info.checksum.c_str());
      return 0;
    }
    if (*nget) {
      auto store = nam::OpenStore(NamUri(nam_uri));
      std::string bytes;
      store->GetInto(obj_name, bytes);
      if (out_file.empty()) {
        if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() || std::fflush(stdout) != 0)
          ThrowErrno("writing to stdout");
      } else {
        WriteFileAtomic(out_file, bytes);
      }
      return 0;
    }
    if (*nstat) {
      auto store = nam::OpenStore(NamUri(nam_uri));
      auto info = store->Stat(obj_name);
      if (!info) Throw(ErrorKind::kNotFound, "NAM " + store->Uri() + ": no object '" + obj_name + "'");
      PrintInfo(*info);
      return 0;
    }
    if (*nls) {
      auto store = nam::OpenStore(NamUri(nam_uri));
      for (const auto& i : store->List(prefix)) {
        if (as_json) {
          std::printf("%s\n", nlohmann::json({{"name", i.name}, {"size", i.size}, {"checksum", i.checksum},
                                               {"version", i.version}, {"meta", i.meta}}).dump().c_str());
        } else if (i.meta.contains("damaged")) {
          std::printf("%12s  %-5s %-16s  %s  (%s)\n", "-", "-", "DAMAGED", i.name.c_str(),
                      i.meta["damaged"].get<std::string>().c_str());
        } else {
          std::printf("%12llu  v%-4llu %s  %s\n", static_cast<unsigned long long>(i.size),
                      static_cast<unsigned long long>(i.version), i.checksum.c_str(), i.name.c_str());
        }
      }
      return 0;
    }
    if (*nrm) {
      auto store = nam::OpenStore(NamUri(nam_uri));
      if (!store->Remove(obj_name)) Throw(ErrorKind::kNotFound, "NAM " + store->Uri() + ": no object '" + obj_name + "'");
      std::printf("removed %s\n", obj_name.c_str());
      return 0;
    }
    if (*nverify) {
      auto store = nam::OpenStore(NamUri(nam_uri));
      nam::VerifyReport r = nam::Verify(*store, repair);
      for (const auto& d : r.damaged)
        std::printf("DAMAGED %s: %s%s\n", Printable(d.name, 300).c_str(), d.why.c_str(),
                    d.moved_to.empty() ? "" : ("\n  -> " + d.moved_to).c_str());
      std::printf("%s: %lld objects checked, %s of good data, %zu damaged%s\n", store->Uri().c_str(),
                  static_cast<long long>(r.objects), HumanBytes(static_cast<double>(r.bytes)).c_str(), r.damaged.size(),
                  r.damaged.empty() ? "" : repair ? " (moved aside)" : " (run with --repair to move them aside)");
      return r.damaged.empty() || repair ? 0 : ExitCode(ErrorKind::kCorrupt);
    }
    if (*ndf) {
      std::string uri = NamUri(nam_uri);
      if (uri.rfind("fabric://", 0) != 0) Throw(ErrorKind::kUnsupported, "nam df: '" + uri + "' is not a NAM server (fabric://)");
      nam::FabricStore store(uri);
      std::printf("%s\n", store.Capacity().dump(2).c_str());
      return 0;
    }
    if (*scaling) {
      workflow::Pipeline p = workflow::LoadPipeline(pipeline_path);
      orchestrator::Machine m = orchestrator::LoadMachine(machine_override.empty() ? p.machine : machine_override);
      if (m.launcher != "local")
        Throw(ErrorKind::kUnsupported, "scaling: machine '" + m.name + "' has launcher '" + m.launcher +
                                           "'; scaling studies run on the local launcher");
      scaling_opt.ranks.clear();
      for (const auto& r : SplitList(scaling_ranks, "--ranks")) {
        char* end = nullptr;
        long long v = std::strtoll(r.c_str(), &end, 10);
        if (!end || *end || v < 1 || v > 4096)
          Throw(ErrorKind::kInvalidInput, "scaling: --ranks: \"" + r + "\" is not a rank count in 1..4096");
        scaling_opt.ranks.push_back(v);
      }
      scaling_opt.steps = SplitList(scaling_steps, "--steps");
      if (!scaling_modes.empty()) scaling_opt.modes = SplitList(scaling_modes, "--modes");
      scaling_opt.runs_dir = runs_dir;
      scaling_opt.msaflow_exe = SelfExe();
      orchestrator::InstallInterruptHandlers();
      orchestrator::RunScaling(p, m, scaling_opt, stdout);
      return 0;
    }
    if (*submit) {
      workflow::Pipeline p = workflow::LoadPipeline(pipeline_path);
      std::string machine_arg = machine_override.empty() ? p.machine : machine_override;
      orchestrator::Machine m = orchestrator::LoadMachine(machine_arg);
      if (m.launcher != "slurm")
        Throw(ErrorKind::kInvalidInput, "submit: machine '" + m.name + "' has launcher '" + m.launcher +
                                            "'; submit needs a Slurm machine file (configs/machines/slurm-local.json) "
                                            "or use `msaflow run`");
      std::string id = run_id.empty() ? orchestrator::NewRunId(p.name) : run_id;
      nam::ValidateObjectName(id);
      std::string runs_abs = std::filesystem::absolute(runs_dir).lexically_normal().string();
      std::string rd = runs_abs + "/" + id;
      if (PathExists(rd + "/journal.jsonl") || PathExists(rd + "/submitted.json"))
        Throw(ErrorKind::kInvalidInput, "run directory " + rd + " already holds a run; choose another --run-id");
      MakeDirs(rd);
      const auto& cm = m.Module("cm", "submit: the coordinator");
      std::string machine_abs = machine_arg == "local" ? machine_arg : std::filesystem::absolute(machine_arg).string();
      // With a NAM module, the NAM server is component 1 of the coordinator's job: it lives
      // exactly as long as the run.
      bool nam_component = p.nam.empty() && m.nam.uri.empty() && m.nam.serve && !m.nam.module.empty();
      std::string nam_part;
      if (nam_component) {
        const auto& nm = m.Module(m.nam.module, "submit: the NAM server");
        nam_part = "#SBATCH hetjob\n#SBATCH --partition=" + nm.partition + " --nodes=1 --ntasks=1 --time=" + nm.time +
                   (nm.constraint.empty() ? "" : " --constraint=" + nm.constraint) +
                   "\n# component 1: the run's NAM server (module " + m.nam.module + ")\nexport MSAFLOW_NAM_HET_GROUP=1\n";
      }
      std::string script = "#!/bin/bash\n#SBATCH --job-name=msaflow-" + id + "\n#SBATCH --output=" + rd +
                           "/coordinator.out\n#SBATCH --partition=" + cm.partition +
                           " --nodes=1 --ntasks=1 --time=" + cm.time + "\n" + nam_part + "# the coordinator of run " + id +
                           ": it submits one job per round\nexec " + orchestrator::ShellQuote(SelfExe()) + " run " +
                           orchestrator::ShellQuote(std::filesystem::absolute(pipeline_path).string()) + " --runs " +
                           orchestrator::ShellQuote(runs_abs) + " --run-id " + id + " --machine " +
                           orchestrator::ShellQuote(machine_abs) + "\n";
      WriteFileAtomic(rd + "/coordinator.sh", script);
      orchestrator::SlurmCli cli(m.slurm.conf);
      std::string job = cli.Submit(rd + "/coordinator.sh", {});
      WriteFileAtomic(rd + "/submitted.json",
                      nlohmann::json{{"run", id}, {"job", job}, {"slurm_conf", m.slurm.conf}}.dump() + "\n");
      std::printf("run %s submitted as Slurm job %s (its coordinator runs on %s)\n  follow it: msaflow status %s\n",
                  id.c_str(), job.c_str(), cm.partition.c_str(), rd.c_str());
      std::fflush(stdout);
      if (!wait) return 0;
      size_t shown = 0;
      std::string end;
      for (;;) {
        // Progress: the run's journal as it grows (a line being written is read next time).
        if (PathExists(rd + "/journal.jsonl")) {
          const auto journal = orchestrator::ReadJournal(rd + "/journal.jsonl");
          for (; shown < journal.events.size(); ++shown) {
            const auto& e = journal.events[shown];
            const auto& f = e.fields;
            if (e.event == "task-start") std::printf("  %s started\n", f.value("task", "").c_str());
            if (e.event == "slurm-job")
              std::printf("  round %d: Slurm %s job %s\n", f.value("round", 0), f.value("mode", "").c_str(),
                          f.value("job", "").c_str());
            if (e.event == "round-end")
              std::printf("  round %d: champion %s accuracy %.4f\n", f.value("round", 0), f.value("champion", "").c_str(),
                          f.value("accuracy", 0.0));
            if (e.event == "slurm-retry") std::printf("  retry: %s\n", f.value("message", "").c_str());
          }
          std::fflush(stdout);
        }
        auto comps = orchestrator::ParseShowJob(cli.Show(job));
        end = comps.empty() ? "FAILED" : orchestrator::EndState(comps);
        if (!end.empty()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
      std::printf("coordinator job %s ended %s\n", job.c_str(), orchestrator::DescribeState(end).c_str());
      orchestrator::PrintStatus(rd, stdout);
      return end == "COMPLETED" ? 0 : 1;
    }
    if (*status) {
      switch (orchestrator::PrintStatus(run_dir, stdout)) {
        case orchestrator::RunState::kFinished: return 0;
        case orchestrator::RunState::kRunning: return 75;  // EX_TEMPFAIL: ask again later
        default: return 1;
      }
    }
    if (*why) {
      orchestrator::ExplainTask(run_dir, why_task, stdout);
      return 0;
    }
    if (*resume) {
      orchestrator::RunOptions opt;
      opt.msaflow_exe = SelfExe();
      orchestrator::InstallInterruptHandlers();
      orchestrator::ResumeRun(run_dir, opt, stdout);
      return 0;
    }
    if (*module) return RunModule(step, task_file, &argc, &argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "msaflow: error: %s\n", e.what());
    return ExitCode(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "msaflow: internal error: %s\n", e.what());
    return 70;
  }
  return 0;
}
