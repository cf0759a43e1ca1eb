// msaflow: the command-line front end. This file defines the commands and their options
// (cli::Options) and dispatches; the commands live in cli/*_commands.cc. Exit codes: cli/cli.h.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli.h"
#include "common/strings.h"
#include "common/version.h"
#include "workflow/kinds.h"

using namespace msaflow;

namespace {

// A command and what runs it once parsed.
struct Command {
  CLI::App* app;
  std::function<int(cli::Options&)> handler;
};

// The commands that take a pipeline: validate, plan, submit, run, scaling.
void AddPipelineCommands(CLI::App& app, cli::Options& o, std::vector<Command>& commands) {
  auto* validate = app.add_subcommand("validate", "Check a pipeline JSON; print a summary or the first error");
  validate->add_option("pipeline", o.pipeline_path, "pipeline JSON file")->required();
  validate->add_flag("--structure-only", o.structure_only,
                     "check the file alone (keys, types, ranges, the rules between them), not its machine, datasets "
                     "or models: for a pipeline written for another machine");

  auto* plan = app.add_subcommand("plan", "Print the plan of round 1: tasks, modules, ranks and commands");
  plan->add_option("pipeline", o.pipeline_path, "pipeline JSON file")->required();
  plan->add_option("--machine", o.machine_override, "machine name or file (overrides the pipeline's)");
  plan->add_option("--launcher", o.launcher_override, "local: commands per rank; slurm: the exact batch script of round 1")
      ->check(CLI::IsMember({"local", "slurm"}));
  plan->add_option("--runs", o.runs_dir, "directory holding run directories")->capture_default_str();
  plan->add_option("--ranks", o.ranks_choice,
                   "pipeline: the ranks the pipeline names; auto: ranks per step from the last run's measured costs "
                   "and the machine's limits, with the reason for each")
      ->check(CLI::IsMember({"pipeline", "auto"}))
      ->capture_default_str();

  auto* submit = app.add_subcommand("submit", "Submit a run to Slurm: its coordinator becomes a job on the cm module");
  submit->add_option("pipeline", o.pipeline_path, "pipeline JSON file")->required();
  submit->add_option("--machine", o.machine_override, "machine file with launcher slurm (overrides the pipeline's)");
  submit->add_option("--runs", o.runs_dir, "directory holding run directories")->capture_default_str();
  submit->add_option("--run-id", o.run_id, "run id (default: <name>-<time>-<random>)");
  submit->add_flag("--wait", o.wait, "follow the run to its end, with progress; exit 1 unless it completes");

  auto* run = app.add_subcommand("run", "Run a pipeline on this machine (blocking, with progress)");
  run->add_option("pipeline", o.pipeline_path, "pipeline JSON file")->required();
  run->add_option("--runs", o.runs_dir, "directory holding run directories and the default NAM")->capture_default_str();
  run->add_option("--run-id", o.run_id, "run id (default: <name>-<time>-<random>)");
  run->add_option("--machine", o.machine_override, "machine name or file (overrides the pipeline's)");
  run->add_option("--ranks", o.ranks_choice, "pipeline | auto (as for plan)")
      ->check(CLI::IsMember({"pipeline", "auto"}))
      ->capture_default_str();

  auto* scaling = app.add_subcommand("scaling", "Strong or weak scaling of a pipeline's steps: a table of time, "
                                                "speed-up and efficiency per step and training mode");
  scaling->add_option("pipeline", o.pipeline_path, "pipeline JSON file")->required();
  scaling->add_option("--ranks", o.scaling_ranks, "rank counts, e.g. 1,2,4")->capture_default_str();
  scaling->add_flag("--weak", o.scaling_opt.weak, "grow the datasets' limits with the ranks (default: strong scaling)");
  scaling->add_option("--steps", o.scaling_steps, "steps to scale: prepare,train,evaluate")->capture_default_str();
  scaling->add_option("--modes", o.scaling_modes, "training modes to compare, e.g. sync,async,hybrid (default: the pipeline's)");
  scaling->add_option("--runs", o.runs_dir, "directory for the study")->capture_default_str();
  scaling->add_option("--machine", o.machine_override, "machine name or file (overrides the pipeline's)");

  auto* rank = app.add_subcommand("rank", "Rank a pipeline's backbones by how well their features suit its training "
                                          "data, on a stratified subset, training nothing: a table of leave-one-out "
                                          "kNN accuracy, LogME and seconds (docs/search.md)");
  rank->add_option("pipeline", o.pipeline_path, "pipeline JSON file")->required();
  rank->add_option("--fraction", o.rank.fraction, "of each class's training images")
      ->check(CLI::Range(0.001, 1.0))
      ->capture_default_str();
  rank->add_option("--min-per-class", o.rank.min_per_class, "at least this many images a class (all when it has fewer)")
      ->check(CLI::Range(int64_t{2}, int64_t{100000}))
      ->capture_default_str();
  rank->add_option("--max-images", o.rank.max_images, "the subset is cut to this many (the estimates grow as its square)")
      ->check(CLI::Range(int64_t{10}, int64_t{20000}))
      ->capture_default_str();
  rank->add_option("--seed", o.rank.seed, "which images the subset takes")->capture_default_str();
  rank->add_flag("--json", o.as_json, "one JSON object");

  auto* simulate = app.add_subcommand("simulate", "Predict a run on a machine, from what earlier runs of the pipeline "
                                                  "measured: makespan per round and step, node-seconds held and used per "
                                                  "module, the ranks the model favours (SimGrid; docs/simulate.md)");
  simulate->add_option("pipeline", o.pipeline_path, "pipeline JSON file")->required();
  simulate->add_option("--machine", o.machine_override, "machine name or file (default: the pipeline's)");
  simulate->add_option("--from-runs", o.sim_from, "a run directory, or a directory of runs, of this pipeline")->required();
  simulate->add_option("--ranks", o.sim_ranks, "STEP=N, e.g. train=64 (default: the pipeline's)");
  simulate->add_option("--nodes", o.sim_nodes, "MODULE=N, e.g. esb=512 (default: the machine's)");
  simulate->add_option("--data-scale", o.sim.data_scale, "the images times this")
      ->check(CLI::Range(0.001, 1e6))
      ->capture_default_str();
  simulate->add_option("--rounds", o.sim.rounds, "rounds (default: as many as the latest run had)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  simulate->add_option("--link-bandwidth", o.sim.link_bytes_per_s, "bytes/s of each node's link to the fabric")
      ->check(CLI::Range(1e6, 1e13))
      ->capture_default_str();
  simulate->add_option("--latency", o.sim.latency_s, "seconds per message")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  simulate->add_option("--queue-wait", o.sim.queue_wait_s, "Slurm: seconds each job waits (default: as measured)");
  simulate->add_option("--slurm-mode", o.sim.slurm_mode, "hetjob | chained (default: the machine's)")
      ->check(CLI::IsMember({"hetjob", "chained"}));
  simulate->add_flag("--json", o.as_json, "one JSON object");

  commands.push_back({validate, cli::Validate});
  commands.push_back({simulate, cli::Simulate});
  commands.push_back({rank, cli::Rank});
  commands.push_back({plan, [](cli::Options& opt) { return cli::PlanOrRun(opt, true); }});
  commands.push_back({submit, cli::Submit});
  commands.push_back({run, [](cli::Options& opt) { return cli::PlanOrRun(opt, false); }});
  commands.push_back({scaling, cli::Scaling});
}

// The commands that take a run directory (status, report, why, resume, cancel), and module.
void AddRunCommands(CLI::App& app, cli::Options& o, std::vector<Command>& commands, int* argc, char*** argv) {
  auto* status = app.add_subcommand("status", "Show the state of a run directory and a table of its tasks; exit 0 "
                                              "finished, 1 failed or interrupted, 75 still running. Given a "
                                              "directory of runs (default: runs), a table of its runs");
  o.run_dir = "runs";
  status->add_option("run_dir", o.run_dir, "runs/<id>, or a directory of runs")->capture_default_str();

  auto* report = app.add_subcommand("report", "Write a run's report: one self-contained HTML file with the accuracy "
                                              "of every candidate per round, a Gantt chart of its tasks, the training "
                                              "curves and the champion's confusion matrix");
  report->add_option("run_dir", o.run_dir, "runs/<id>")->required();
  report->add_option("-o,--output", o.out_file, "where to write it (default: RUN_DIR/report.html)");

  auto* why = app.add_subcommand("why", "Say whether a task of a run ran or was reused, and what changed since the "
                                        "last run that had it");
  why->add_option("run_dir", o.run_dir, "runs/<id>")->required();
  why->add_option("task", o.why_task, "task id, r<round>-<step> (e.g. r1-prepare); or, in a halving run, a backbone: "
                                      "why rung 0 kept or dropped it")->required();

  auto* resume = app.add_subcommand("resume", "Continue a run whose coordinator died or failed: what finished is "
                                              "reused, the rest runs");
  resume->add_option("run_dir", o.run_dir, "runs/<id>")->required();
  resume->add_option("--reason", o.resume_reason,
                     "why it is resumed, and by whom: recorded in the journal's resume "
                     "event (`msaflow serve` says so when it resumes a run its stop "
                     "interrupted)");

  auto* cancel = app.add_subcommand("cancel", "Stop a running run: its coordinator ends the run's tasks and Slurm "
                                              "jobs and records it as interrupted (`resume` continues it)");
  cancel->add_option("run_dir", o.run_dir, "runs/<id>")->required();

  auto* module = app.add_subcommand("module", "Run one step of a round as a module process (what launchers start)");
  module->add_option("step", o.step, "load | prepare | train | store | evaluate | select")
      ->required()
      ->check(CLI::IsMember([] {
        std::vector<std::string> names;
        names.reserve(workflow::kSteps.size());
        for (workflow::Step s : workflow::kSteps) names.emplace_back(workflow::StepName(s));
        return names;
      }()));
  module->add_option("--task", o.task_file, "task JSON written by the planner")->required()->check(CLI::ExistingFile);

  commands.push_back({status, cli::Status});
  commands.push_back({report, cli::Report});
  commands.push_back({why, cli::Why});
  commands.push_back({resume, cli::Resume});
  commands.push_back({cancel, cli::Cancel});
  // Errors are said per rank, inside.
  commands.push_back({module, [=](cli::Options& opt) { return cli::RunModule(opt.step, opt.task_file, argc, argv); }});
}

// `msaflow nam ...`: the server and the object commands.
void AddNamCommands(CLI::App& app, cli::Options& o, std::vector<Command>& commands) {
  auto* nam_cmd = app.add_subcommand("nam", "The NAM: serve it, or put/get/stat/ls/rm objects by hand");
  nam_cmd->require_subcommand(1);
  auto* serve = nam_cmd->add_subcommand("serve", "Run a NAM server (until SIGTERM or SIGINT)");
  serve->add_option("--listen", o.sopt.listen, "HOST:PORT (port 0 picks a free one; host * is this node's name)")->capture_default_str();
  serve->add_option("--capacity", o.capacity, "memory pool size (e.g. 512MiB, 4GiB)")->capture_default_str();
  serve->add_option("--persist", o.sopt.persist_dir, "write committed objects through to DIR; reload them on start");
  serve->add_option("--token-file", o.sopt.token_file, "clients must present this token (required off loopback)");
  serve->add_option("--provider", o.sopt.provider, "libfabric provider: tcp (tcp;ofi_rxm), shm, or a full name")
      ->capture_default_str();
  serve->add_option("--users-lock", o.sopt.users_lock,
                    "stop once no process holds a shared lock on FILE (runs sharing this server hold one)");
  serve->add_option("--lock-wait", o.sopt.lock_wait_s, "seconds to wait for another server to let go of --persist DIR")
      ->capture_default_str();
  serve->add_option("--ready-file", o.sopt.ready_file, "write {uri, pid} here once serving; removed on exit");
  serve->add_option("--lease", o.sopt.lease_s, "seconds before a silent client's session is dropped")->capture_default_str();
  serve->add_flag("--no-map", o.no_map, "never let same-node clients map the pool (bytes move by RMA only)");
  serve->add_flag("--verbose", o.sopt.verbose, "log every request");

  auto add_nam = [&](CLI::App* c) {
    c->add_option("--nam", o.nam_uri, "NAM URI (default: $MSAFLOW_NAM)");
  };
  auto* nput = nam_cmd->add_subcommand("put", "Store a file (or stdin) as an object");
  nput->add_option("name", o.obj_name, "object name")->required();
  nput->add_option("file", o.obj_file, "file to store ('-' or absent: stdin)");
  nput->add_option("--meta", o.meta_text, "metadata, a JSON object");
  add_nam(nput);
  auto* nget = nam_cmd->add_subcommand("get", "Fetch an object's bytes (checksum verified)");
  nget->add_option("name", o.obj_name, "object name")->required();
  nget->add_option("-o,--output", o.out_file, "write here (atomically) instead of stdout");
  add_nam(nget);
  auto* nstat = nam_cmd->add_subcommand("stat", "Show an object's size, checksum, version and metadata");
  nstat->add_option("name", o.obj_name, "object name")->required();
  add_nam(nstat);
  auto* nls = nam_cmd->add_subcommand("ls", "List objects by name prefix");
  nls->add_option("prefix", o.prefix, "name prefix");
  nls->add_flag("--json", o.as_json, "one JSON object per line");
  add_nam(nls);
  auto* nrm = nam_cmd->add_subcommand("rm", "Remove an object");
  nrm->add_option("name", o.obj_name, "object name")->required();
  add_nam(nrm);
  auto* ndf = nam_cmd->add_subcommand("df", "Show a NAM server's capacity and use");
  add_nam(ndf);
  auto* nverify = nam_cmd->add_subcommand("verify", "Read every object, check every checksum, list the damaged ones");
  nverify->add_flag("--repair", o.repair, "move the damaged objects aside (DIR/DAMAGED/), so reads say 'no object'");
  add_nam(nverify);

  for (Command c : {Command{serve, cli::NamServe}, Command{nput, cli::NamPut}, Command{nget, cli::NamGet},
                    Command{nstat, cli::NamStat}, Command{nls, cli::NamLs}, Command{nrm, cli::NamRm},
                    Command{nverify, cli::NamVerify}, Command{ndf, cli::NamDf}})
    commands.push_back(std::move(c));
}

// `msaflow serve` and `msaflow users ...` (docs/service.md).
void AddServiceCommands(CLI::App& app, cli::Options& o, std::vector<Command>& commands) {
  auto* serve = app.add_subcommand("serve", "Serve runs over HTTP: a multi-user API, event streams and a web dashboard "
                                            "(until SIGTERM or SIGINT; docs/service.md)");
  serve->add_option("--listen", o.serve.listen, "HOST:PORT (port 0 picks a free one)")->capture_default_str();
  serve->add_option("--runs", o.runs_dir, "directory of the service's runs, a folder per user")->capture_default_str();
  serve->add_option("--users", o.serve.users_file, "users file (`msaflow users add` makes it)")->required();
  serve->add_option("--machine", o.serve.machine, "machine every run uses (default: each pipeline's, a built-in "
                                                  "machine or a file in the user's folders)");
  serve->add_option("--max-running", o.serve.max_running, "runs running at once, all users together")->capture_default_str();
  serve->add_option("--tls-cert", o.serve.tls_cert, "PEM certificate: serve HTTPS");
  serve->add_option("--tls-key", o.serve.tls_key, "PEM private key of --tls-cert");
  serve->add_flag("--insecure", o.serve.insecure, "allow plain HTTP on an address other than loopback");
  serve->add_option("--ready-file", o.serve.ready_file, "write {url, pid} here once serving; removed on exit");
  serve->add_option("--max-streams", o.serve.max_streams, "event streams open at once")->capture_default_str();
  serve->add_option("--request-timeout", o.serve.request_timeout_s,
                    "seconds a client has to send a request's body after its headers (the headers: 10 s)")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  serve->add_option("--model", o.serve_models, "NAME=PATH: a model every user may infer with at /v2/models/NAME "
                                                "(a run directory or an exported .onnx; repeat)");
  serve->add_option("--max-batch", o.serve.max_batch, "inference: images run together")->capture_default_str();
  serve->add_option("--max-delay-ms", o.serve.max_delay_ms, "inference: how long a request waits for company")
      ->capture_default_str();

  auto* users = app.add_subcommand("users", "Manage the service's users file: add, remove, list");
  users->require_subcommand(1);
  auto* add = users->add_subcommand("add", "Add a user; prints their new token alone on the last line, once");
  add->add_option("name", o.user_name, "user name (a-z, 0-9, _ and -)")->required();
  add->add_option("--users", o.users_file, "users file (made if absent, mode 0600)")->required();
  add->add_option("--allow", o.user_allow, "a folder whose datasets and models the user's pipelines may name (repeat)");
  add->add_option("--max-running", o.user_max_running, "runs of theirs running at once (0: no bound of their own)")
      ->check(CLI::Range(0, 10000));
  add->add_option("--account", o.user_account, "Slurm account charged for every job their runs cause");
  auto* remove = users->add_subcommand("remove", "Remove a user (their runs are kept)");
  remove->add_option("name", o.user_name, "user name")->required();
  remove->add_option("--users", o.users_file, "users file")->required();
  auto* list = users->add_subcommand("list", "List the users: name, quota, account, folders (never tokens)");
  list->add_option("--users", o.users_file, "users file")->required();

  commands.push_back({serve, cli::Serve});
  commands.push_back({add, cli::UsersAdd});
  commands.push_back({remove, cli::UsersRemove});
  commands.push_back({list, cli::UsersList});
}

// `msaflow export` and `msaflow predict` (docs/inference.md).
void AddModelCommands(CLI::App& app, cli::Options& o, std::vector<Command>& commands) {
  auto* ex = app.add_subcommand("export", "Write a finished run's champion (or a candidate) as one ONNX model: "
                                          "backbone, pooling, head and softmax");
  ex->add_option("run", o.run_dir, "the run's directory (runs/<id>)")->required();
  ex->add_option("--candidate", o.candidate, "a candidate the run trained (default: the champion)");
  ex->add_option("-o,--output", o.out_file, "the .onnx file to write")->required();
  ex->add_flag("--with-preprocessing", o.with_preprocessing,
               "take raw 8-bit images [N, rows, cols, channels]: resize and normalise in the graph");
  auto* pr = app.add_subcommand("predict", "Classify images with a run's champion or an exported model");
  pr->add_option("model", o.run_dir, "a run's directory, or a .onnx file `msaflow export` wrote")->required();
  pr->add_option("images", o.images, "PNG or JPEG files, folders, or an IDX/.npy image file (with --labels)")
      ->required();
  pr->add_option("--labels", o.labels, "the label file of an IDX or .npy image file (optional; with it, the accuracy)");
  pr->add_option("--candidate", o.candidate, "with a run: a candidate it trained (default: the champion)");
  pr->add_option("--top", o.top, "classes shown per image")->check(CLI::Range(1, 1000))->capture_default_str();
  pr->add_option("--limit", o.limit, "the first N images only (0: all)")->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  pr->add_flag("--json", o.as_json, "one JSON array, an object per image in input order");
  pr->add_option("--batch", o.predict_batch, "images the backbone runs at once")->check(CLI::Range(1, 4096))
      ->capture_default_str();
  commands.push_back({ex, cli::Export});
  commands.push_back({pr, cli::Predict});
}

// An unknown command word is a usage error naming it and the nearest command, with or without
// --help beside it (CLI11 would answer `msaflow serv --help` with the top-level help and exit 0,
// so a script's typo would pass). Returns the message, or "" when every command word is known.
std::string UnknownCommand(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "msaflow";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') continue;  // --help, --version
    const auto subs = at->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) return "";  // a command's own arguments from here on
    auto found = std::find_if(subs.begin(), subs.end(), [&](CLI::App* s) { return s->get_name() == word; });
    if (found != subs.end()) {
      at = *found;
      path += " " + word;
      continue;
    }
    // The nearest command here, else the nearest one level down (`serv` for `nam serve`).
    std::vector<std::string> names, below, below_path;
    for (CLI::App* s : subs) {
      names.push_back(s->get_name());
      for (CLI::App* n : s->get_subcommands([](CLI::App*) { return true; })) {
        below.push_back(n->get_name());
        below_path.push_back(s->get_name() + " " + n->get_name());
      }
    }
    std::string near = Nearest(word, names);
    if (near.empty()) {
      const std::string child = Nearest(word, below);
      if (!child.empty()) near = below_path[static_cast<size_t>(std::find(below.begin(), below.end(), child) - below.begin())];
    }
    const std::string hint = near.empty() ? "" : " — did you mean \"" + near + "\"?";
    return "'" + word + "' is not a command of " + path + hint + " (`" + path + " --help` lists them)";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // Debian's libfabric loads libinfinipath, whose constructor catches SIGABRT, SIGINT and SIGTERM
  // with a handler that calls exit(): an abort then deadlocked on the malloc lock it held (a run
  // hung until the test's timeout instead of dying), and a stop signal ran destructors under
  // threads still computing. The defaults again; commands that handle a stop signal say so.
  for (const int sig : {SIGABRT, SIGINT, SIGTERM}) ::signal(sig, SIG_DFL);
  cli::Options o;
  CLI::App app{"msaflow — transfer-learning workflows on a Modular Supercomputer Architecture"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("msaflow ") + kVersion);
  std::vector<Command> commands;
  AddPipelineCommands(app, o, commands);
  AddRunCommands(app, o, commands, &argc, &argv);
  AddNamCommands(app, o, commands);
  AddServiceCommands(app, o, commands);
  AddModelCommands(app, o, commands);

  if (const std::string unknown = UnknownCommand(app, argc, argv); !unknown.empty()) {
    std::fprintf(stderr, "msaflow: error: %s\n", unknown.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    for (const auto& [command, handler] : commands)
      if (command->parsed()) return handler(o);
  } catch (const Error& e) {
    std::fprintf(stderr, "msaflow: error: %s\n", OneLine(e.message()).c_str());
    return cli::ExitCode(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "msaflow: internal error: %s\n", OneLine(e.what()).c_str());
    return 70;
  }
  return 0;
}
