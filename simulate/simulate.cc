// The model on SimGrid's S4U: one host per node of each module and one for the NAM, each with its
// own link to the fabric (a star); a coordinator actor walks the rounds, and each step's ranks
// are actors on their nodes that compute (executions sized in measured seconds), move bytes to
// and from the NAM, and, when training together, exchange gradients every step (a ring for sync,
// a parameter server for async, both for hybrid). SimGrid shares links and cores among what runs
// at once; the coordinator measures when each step starts and ends.
#include <fmt/core.h>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "common/error.h"
#include "simulate/simulate.h"
#include "workflow/kinds.h"

namespace msaflow::simulate {
namespace {

namespace sg4 = simgrid::s4u;
using nlohmann::json;

constexpr double kSpeed = 1e9;            // flop/s of one core: a measured second of work is 1e9 flops
constexpr double kLoopbackBytes = 8e9;    // bytes/s between two processes of one node
constexpr int64_t kChunksPerStep = 8;     // a rank's training is simulated in this many pieces

// What one step of one round runs, as the model sees it.
struct StepWork {
  StepModel m;
  std::string module;
  int64_t ranks = 1, nodes = 1, per_node = 1;
  int64_t threads = 1;  // each rank's: the node's cores over its ranks there
  workflow::TrainMode mode = workflow::TrainMode::kIndependent;
  int64_t groups = 1;
  double scale = 1;  // data scale for this step's work and bytes
};

void Transfer(sg4::Host* from, sg4::Host* to, double bytes) {
  if (bytes <= 0) return;
  if (from == to) {
    sg4::this_actor::sleep_for(bytes / kLoopbackBytes);
    return;
  }
  sg4::Comm::sendto(from, to, static_cast<uint64_t>(bytes));
}

// Core-seconds of the step's divisible work at the simulated data size.
double Work(const StepWork& w) { return w.m.fixed_core_s + w.m.per_item_s * w.m.size * w.scale; }

// The serial part for this many ranks: several start through mpirun.
double Serial(const StepWork& w, int64_t ranks) {
  auto it = w.m.serial_by_ranks.find(ranks > 1);
  return it != w.m.serial_by_ranks.end() ? it->second : w.m.serial_s;
}

// `core_s` core-seconds of work on this rank's threads, on the cores of `cpu`.
void Compute(sg4::Host* cpu, const StepWork& w, double core_s) {
  if (core_s <= 0) return;
  const int t = static_cast<int>(w.threads);
  sg4::this_actor::exec_init(core_s * kSpeed / t)->set_host(cpu)->set_thread_count(t)->wait();
}

// Rank i of a step: start, read from the NAM, compute (exchanging gradients when training
// together), write to the NAM. Its bytes go from its node's host; its work runs on `cpu`: that
// host, or the one machine whose cores every node shares.
void RankBody(const StepWork& w, int64_t i, const std::vector<sg4::Host*>& hosts, sg4::Host* shared_cpu,
              sg4::Host* nam, const sg4::BarrierPtr& barrier, double latency_s) {
  sg4::Host* me = hosts[static_cast<size_t>(i)];
  sg4::Host* cpu = shared_cpu ? shared_cpu : me;
  const double r = static_cast<double>(w.ranks);
  sg4::this_actor::exec_init(Serial(w, w.ranks) * kSpeed)->set_host(cpu)->wait();
  Transfer(nam, me, w.m.nam_in_bytes * w.scale / r);
  const workflow::Step step = w.m.step;
  if (step == workflow::Step::kEvaluate) {  // the farm hands out (model x shard) tasks: some ranks get one more
    const int64_t items = w.m.items, mine = items / w.ranks + (i < items % w.ranks ? 1 : 0);
    Compute(cpu, w, items > 0 ? Work(w) * static_cast<double>(mine) / static_cast<double>(items) : Work(w) / r);
  } else if (step == workflow::Step::kTrain && w.ranks > 1 && workflow::RanksShareModels(w.mode) &&
             w.m.model_bytes > 0) {
    const bool grouped = workflow::HasGroups(w.mode);
    const int64_t g = grouped ? std::max<int64_t>(1, std::min(w.groups, w.ranks)) : 1;
    const int64_t group_size = std::max<int64_t>(1, w.ranks / g), group = std::min(i / group_size, g - 1),
                  in_group = i - group * group_size;
    // The updates this rank takes part in: all of them in sync (each is one global batch split
    // over the ranks), its group's in hybrid, its own in async; how each is exchanged: in an
    // allreduce ring (sync: all ranks; hybrid: the group's), with the parameter server (async:
    // every rank; hybrid: each group's first), the ranks in lockstep (sync).
    const double updates = static_cast<double>(w.m.items) * w.scale;
    double steps = updates;
    bool ring = false, server = false;
    switch (w.mode) {
      case workflow::TrainMode::kSync:
        ring = true;
        break;
      case workflow::TrainMode::kHybrid:
        steps = updates / static_cast<double>(g);
        ring = true;
        server = in_group == 0;
        break;
      case workflow::TrainMode::kAsync:
        steps = updates / r;
        server = true;
        break;
      case workflow::TrainMode::kAuto:
      case workflow::TrainMode::kIndependent:
        break;  // not here: the ranks share no model
    }
    const bool lockstep = workflow::RanksInLockstep(w.mode);
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(kChunksPerStep, static_cast<int64_t>(steps)));
    const double per_chunk = steps / static_cast<double>(chunks);
    const double work = Work(w) / r / static_cast<double>(chunks);
    for (int64_t c = 0; c < chunks; ++c) {
      Compute(cpu, w, work);
      if (ring) {
        // Ring allreduce in the (group's) ring: 2(n-1)/n of the gradient out each step, 2(n-1) messages.
        const int64_t n = !grouped ? w.ranks : group == g - 1 ? w.ranks - group * group_size : group_size;
        if (n > 1) {
          const int64_t base = grouped ? group * group_size : 0;
          const int64_t pos = grouped ? in_group : i;
          sg4::Host* next = hosts[static_cast<size_t>(base + (pos + 1) % n)];
          const double dn = static_cast<double>(n);
          Transfer(me, next, per_chunk * 2 * (dn - 1) / dn * w.m.model_bytes);
          sg4::this_actor::sleep_for(per_chunk * 2 * (dn - 1) * latency_s);
        }
      }
      if (server) {
        // To the parameter server and back, every step (its process beside rank 0).
        Transfer(me, hosts[0], per_chunk * w.m.model_bytes);
        Transfer(hosts[0], me, per_chunk * w.m.model_bytes);
      }
      if (lockstep) barrier->wait();
    }
  } else {
    Compute(cpu, w, Work(w) / r);
  }
  Transfer(me, nam, w.m.nam_out_bytes * w.scale / r);
}

int64_t Ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The seconds the model gives a step at `ranks` without contention: for choosing ranks.
double Analytic(const StepWork& w, int64_t ranks, int64_t threads, double link, double latency) {
  const double r = static_cast<double>(ranks), th = static_cast<double>(threads);
  double t = Serial(w, ranks) + Work(w) / r / th + (w.m.nam_in_bytes + w.m.nam_out_bytes) * w.scale / r / link;
  if (w.m.step == workflow::Step::kEvaluate && w.m.items > 0)
    t = Serial(w, ranks) + Work(w) * std::ceil(static_cast<double>(w.m.items) / r) / static_cast<double>(w.m.items) / th;
  if (w.m.step == workflow::Step::kTrain && ranks > 1 && workflow::RanksInLockstep(w.mode))
    t += static_cast<double>(w.m.items) * w.scale * (2 * (r - 1) / r * w.m.model_bytes / link + 2 * (r - 1) * latency);
  return t;
}

// One simulation: the options checked, the rounds' work planned, the platform built, the
// coordinator actor run, the placement worked out.
class Model {
 public:
  Model(const workflow::Pipeline& p, const workflow::Machine& m, const Calibration& c, const Options& o)
      : p_(p), m_(m), c_(c), o_(o) {}

  json Favoured() {
    Check();
    Plan();
    Place();
    return res_.placement["favoured_ranks"];
  }

  Result Run() {
    const auto wall0 = std::chrono::steady_clock::now();
    Check();
    Plan();
    // Actors here are shallow (a rank's loop): 128 KiB stacks (and a guard page) instead of 8 MiB
    // halve the cost of starting one (page faults clearing the stack were most of it).
    int argc = 4;
    char arg0[] = "msaflow-simulate", arg1[] = "--log=root.thres:critical", arg2[] = "--cfg=contexts/stack-size:128",
         arg3[] = "--cfg=contexts/guard-size:1";
    char* argv[] = {arg0, arg1, arg2, arg3, nullptr};
    sg4::Engine e(&argc, argv);
    Platform();
    res_.rounds.resize(plan_.size());
    sg4::Actor::create("coordinator", coordinator_, [this] { Coordinate(); });
    e.run();
    res_.makespan_s = sg4::Engine::get_clock();
    if (!mode_)
      for (auto& [mod, ns] : res_.node_seconds) ns.held = ns.used;
    Place();
    res_.simulation_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return res_;
  }

 private:
  void Check() {
    if (c_.rounds.empty()) Throw(ErrorKind::kInvalidInput, "simulate: the calibration has no rounds");
    if (o_.data_scale <= 0) Throw(ErrorKind::kInvalidInput, "--data-scale must be above 0");
    for (const auto& [step, r] : o_.ranks)
      if (r < 1)
        Throw(ErrorKind::kInvalidInput, std::string("--ranks ") + workflow::StepName(step) + "=" + std::to_string(r) +
                                            ": ranks must be at least 1");
    for (const auto& [name, mod] : m_.modules) nodes_[name] = std::max<int64_t>(1, mod.nodes);
    for (const auto& [name, n] : o_.nodes) {
      if (!m_.modules.count(name)) (void)m_.Module(name, "--nodes");  // throws, naming the modules there are
      if (n < 1) Throw(ErrorKind::kInvalidInput, "--nodes " + name + "=" + std::to_string(n) + ": at least 1");
      nodes_[name] = n;
    }
    slurm_ = !m_.OnThisHost();
    if (slurm_) {
      const auto asked =
          o_.slurm_mode.empty() ? std::optional(m_.slurm.mode) : workflow::SlurmModeFromName(o_.slurm_mode);
      if (!asked || *asked == workflow::SlurmMode::kSingle)
        Throw(ErrorKind::kInvalidInput,
              "--slurm-mode " + (o_.slurm_mode.empty() ? "single" : o_.slurm_mode) + ": expected hetjob or chained");
      mode_ = *asked;
    }
    shared_ = slurm_ && m_.slurm.nodes_share_cores;
    queue_ = !slurm_ ? 0 : o_.queue_wait_s >= 0 ? o_.queue_wait_s : c_.queue_wait_s;
    job_ = !slurm_ ? 0 : c_.job_overhead_s;
    // A chained job after the first: as measured in chained rounds, else as a round's first.
    chain_ = !slurm_ ? 0 : c_.chain_wait_s >= 0 && o_.queue_wait_s < 0 ? c_.chain_wait_s : queue_ + job_;
  }

  // The work of every round, step by step.
  void Plan() {
    const int64_t rounds = o_.rounds > 0 ? o_.rounds : static_cast<int64_t>(c_.rounds.size());
    const int64_t last = static_cast<int64_t>(c_.rounds.size()) - 1;
    for (int64_t k = 0; k < rounds; ++k) {
      const auto& cal = c_.rounds[static_cast<size_t>(std::min(k, last))];
      std::vector<StepWork> steps;
      for (const workflow::Step s : workflow::kSteps) {
        const std::string name = workflow::StepName(s);
        auto it = cal.find(s);
        const workflow::StepSpec* spec = p_.FindStep(s);
        if (it == cal.end() || !spec) continue;
        StepWork w;
        w.m = it->second;
        w.module = spec->module;
        const workflow::ModuleSpec& mod = m_.Module(spec->module, "steps/" + name + "/module");
        w.ranks = o_.ranks.count(s) ? o_.ranks.at(s) : spec->ranks;
        w.nodes = std::min(nodes_[mod.name], w.ranks);
        w.per_node = Ceil(w.ranks, w.nodes);
        w.nodes = Ceil(w.ranks, w.per_node);
        // Nodes sharing one machine's cores: the step's ranks share them all.
        w.threads = std::max<int64_t>(1, NodeCores(mod.name) / (shared_ ? w.ranks : w.per_node));
        w.scale = workflow::Divisible(s) ? o_.data_scale : 1;
        if (s == workflow::Step::kTrain) {
          w.mode = workflow::ResolveAuto(spec->parallel.mode, p_.rounds.candidates, w.ranks);
          w.groups = spec->parallel.groups;
        }
        steps.push_back(w);
      }
      plan_.push_back(std::move(steps));
    }
  }

  // A node's cores: this machine's locally, else the module's max_ranks over its nodes in the
  // machine file (--nodes grows the module, not its nodes).
  int64_t NodeCores(const std::string& module) {
    if (!slurm_ || shared_) return std::max(1u, std::thread::hardware_concurrency());
    const workflow::ModuleSpec& mod = m_.Module(module, "steps");
    return std::max<int64_t>(1, Ceil(mod.max_ranks, std::max<int64_t>(1, mod.nodes)));
  }

  sg4::Host* AddHost(const std::string& name, int cores) {
    sg4::Host* h = zone_->create_host(name, kSpeed)->set_core_count(std::max(1, cores))->seal();
    const sg4::Link* l = zone_->create_link(name + "-link", o_.link_bytes_per_s)->set_latency(o_.latency_s)->seal();
    zone_->add_route(h->get_netpoint(), nullptr, nullptr, nullptr, {sg4::LinkInRoute(l)}, true);
    ++res_.hosts;
    return h;
  }

  // Hosts per module node, the NAM's, the coordinator's (the first CM node).
  void Platform() {
    zone_ = sg4::create_star_zone("msa");
    if (!slurm_) {  // the local machine: every module is this one host and its cores
      sg4::Host* here = AddHost("localhost", static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
      for (const auto& [name, mod] : m_.modules) hosts_[name] = {here};
    } else {
      // Only the nodes some step runs on are hosts (a module's others hold no rank: they count in
      // node-seconds held, not in the simulation), so a 1,000-node machine costs what it uses.
      for (const auto& [name, mod] : m_.modules) {
        const int64_t cores = NodeCores(name);  // more ranks than cores on a node share them
        int64_t used = 1;
        for (const auto& round : plan_)
          for (const auto& w : round)
            if (w.module == name) used = std::max(used, w.nodes);
        for (int64_t i = 0; i < std::min(used, nodes_[name]); ++i)
          hosts_[name].push_back(AddHost(fmt::format("{}{:03d}", name, i + 1), static_cast<int>(cores)));
      }
    }
    if (shared_) {  // the one machine's cores, which every node's ranks compute on
      shared_cpu_ = zone_->create_host("cores", kSpeed)
                        ->set_core_count(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))
                        ->seal();
      ++res_.hosts;
    }
    nam_ = slurm_ ? AddHost("nam", 4) : hosts_.begin()->second[0];
    coordinator_ = hosts_.count("cm") ? hosts_["cm"][0] : hosts_.begin()->second[0];
  }

  // The coordinator actor: the rounds, each step's ranks started and joined.
  void Coordinate() {
    for (size_t k = 0; k < plan_.size(); ++k) {
      RoundResult& rr = res_.rounds[k];
      rr.round = static_cast<int64_t>(k) + 1;
      rr.start_s = sg4::Engine::get_clock();
      // Each job waits in the queue, then costs what calibration measured beyond its steps; a
      // chained round is a job per step, each after the one before.
      for (size_t i = 0; i < plan_[k].size(); ++i) {
        const double wait = i == 0 ? queue_ + job_ : mode_ == workflow::SlurmMode::kChained ? chain_ : 0;
        if (wait > 0) sg4::this_actor::sleep_for(wait);
        rr.steps.push_back(RunStep(plan_[k][i], k));
      }
      rr.seconds = sg4::Engine::get_clock() - rr.start_s;
      if (mode_ == workflow::SlurmMode::kHetjob) {
        std::set<std::string> used;
        for (const auto& w : plan_[k]) used.insert(w.module);
        for (const auto& mod : used) res_.node_seconds[mod].held += static_cast<double>(nodes_[mod]) * (rr.seconds - queue_);
      }
    }
  }

  StepResult RunStep(const StepWork& w, size_t k) {
    StepResult sr;
    sr.step = w.m.step;
    sr.module = w.module;
    sr.ranks = w.ranks;
    sr.nodes = slurm_ ? w.nodes : 1;
    sr.start_s = sg4::Engine::get_clock();
    std::vector<sg4::Host*> where;
    const auto& pool = hosts_.at(w.module);
    const auto last = static_cast<int64_t>(pool.size()) - 1;
    for (int64_t i = 0; i < w.ranks; ++i) where.push_back(pool[static_cast<size_t>(std::min(i / w.per_node, last))]);
    const sg4::BarrierPtr barrier = sg4::Barrier::create(static_cast<unsigned>(w.ranks));
    std::vector<sg4::ActorPtr> ranks;
    const double latency = o_.latency_s;
    sg4::Host *nam = nam_, *cpu = shared_cpu_;
    for (int64_t i = 0; i < w.ranks; ++i) {
      ranks.push_back(sg4::Actor::create(
          fmt::format("r{}-{}-{}", k + 1, workflow::StepName(w.m.step), i), where[static_cast<size_t>(i)],
          [&w, i, &where, cpu, nam, barrier, latency] { RankBody(w, i, where, cpu, nam, barrier, latency); }));
      ++res_.actors;
    }
    for (auto& a : ranks) a->join();
    sr.seconds = sg4::Engine::get_clock() - sr.start_s;
    if (w.ranks == w.m.ranks && o_.data_scale == 1 && k < c_.rounds.size()) sr.measured_s = w.m.measured_s;
    res_.node_seconds[w.module].used += static_cast<double>(sr.nodes) * sr.seconds;
    if (mode_ == workflow::SlurmMode::kChained)
      res_.node_seconds[w.module].held += static_cast<double>(nodes_[w.module]) * sr.seconds;
    return sr;
  }

  // Where it ran, and the ranks the model favours for each divisible step (the largest round's).
  void Place() {
    json steps = json::object(), favour = json::object();
    for (size_t k = 0; k < plan_.size(); ++k)
      for (const auto& w : plan_[k]) {
        const char* name = workflow::StepName(w.m.step);
        steps[name] = {{"module", w.module}, {"ranks", w.ranks}, {"nodes", slurm_ ? w.nodes : 1}};
        if (!workflow::Divisible(w.m.step)) continue;
        if (w.m.step == workflow::Step::kTrain && workflow::UsesParameterServers(w.mode)) continue;
        const workflow::ModuleSpec& mod = m_.Module(w.module, "steps");
        const int64_t cores = NodeCores(w.module), nodes = slurm_ ? nodes_[w.module] : 1;
        const int64_t limit = std::max<int64_t>(1, slurm_ ? std::max(mod.max_ranks, nodes) : std::min(mod.max_ranks, cores));
        auto at = [&](int64_t r) {
          const int64_t per_node = shared_ ? r : Ceil(r, std::min(nodes, r));
          return Analytic(w, r, std::max<int64_t>(1, cores / per_node), o_.link_bytes_per_s, o_.latency_s);
        };
        // 1, 2, 4 ... and the limit itself; the next taken while it saves >= 5 %.
        std::vector<int64_t> tries;
        for (int64_t r = 1; r <= limit; r *= 2) tries.push_back(r);
        if (tries.back() != limit) tries.push_back(limit);
        json table = json::object();
        int64_t best = 1;
        double best_s = 0;
        for (const int64_t r : tries) {
          const double t = at(r);
          table[std::to_string(r)] = t;
          if (r == 1 || t < best_s * 0.95) best = r, best_s = t;
        }
        if (!favour.contains(name) || favour[name]["work_s"].get<double>() < Work(w))
          favour[name] = {{"ranks", best},     {"seconds", best_s},        {"seconds_by_ranks", table},
                          {"work_s", Work(w)}, {"serial_s", Serial(w, 1)}, {"round", k + 1},
                          {"limit", limit}};
      }
    res_.placement = {
        {"mode", mode_ ? workflow::SlurmModeName(*mode_) : "local"}, {"steps", steps}, {"favoured_ranks", favour}};
  }

  const workflow::Pipeline& p_;
  const workflow::Machine& m_;
  const Calibration& c_;
  const Options& o_;
  std::map<std::string, int64_t> nodes_;
  bool slurm_ = false;
  std::optional<workflow::SlurmMode> mode_;  // none: the local launcher
  double queue_ = 0;
  double job_ = 0;    // Slurm: per job beyond the queue wait and the steps (calibrated)
  double chain_ = 0;  // Slurm, chained: a later job's wait after the step before
  bool shared_ = false;  // the nodes share this machine's cores (slurm.nodes_share_cores)
  sg4::Host* shared_cpu_ = nullptr;
  std::vector<std::vector<StepWork>> plan_;
  sg4::NetZone* zone_ = nullptr;
  std::map<std::string, std::vector<sg4::Host*>> hosts_;
  sg4::Host* nam_ = nullptr;
  sg4::Host* coordinator_ = nullptr;
  Result res_;
};

}  // namespace

bool HaveSimGrid() { return true; }

void RequireSimGrid(const std::string&) {}

Result Simulate(const workflow::Pipeline& p, const workflow::Machine& m, const Calibration& c, const Options& o) {
  return Model(p, m, c, o).Run();
}

json FavouredRanks(const workflow::Pipeline& p, const workflow::Machine& m, const Calibration& c, const Options& o) {
  return Model(p, m, c, o).Favoured();
}

}  // namespace msaflow::simulate
