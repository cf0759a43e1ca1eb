#include "report/progress.h"

#include <fmt/core.h>

#include <algorithm>

#include "common/strings.h"
#include "record/journal.h"
#include "record/run_dir.h"

namespace msaflow::report {

using workflow::Candidate;
using workflow::CandidateFromJson;
using workflow::HeadLabel;
using workflow::Ranked;

using nlohmann::json;

namespace {

// Whether a round's prepare computed fine-tuning's maps (its summary's "maps" entries).
bool MapsComputed(const json& prepared) {
  for (const auto& m : prepared.value("maps", json::array()))
    if (m.value("computed", false)) return true;
  return false;
}

// The round's best per class, by name: every class when there are a dozen or fewer, else the
// weakest dozen (where a user looks first).
std::string PerClassLine(const json& per_class, const std::string& split) {
  constexpr size_t kShown = 12;
  std::vector<const json*> shown;
  for (const json& c : per_class) shown.push_back(&c);
  const bool all = shown.size() <= kShown;
  if (!all) {
    std::stable_sort(shown.begin(), shown.end(), [](const json* a, const json* b) {
      return a->value("accuracy", 0.0) < b->value("accuracy", 0.0);
    });
    shown.resize(kShown);
  }
  std::string line = all ? fmt::format("  per class ({} accuracy):", split)
                         : fmt::format("  weakest {} of {} classes ({} accuracy):", kShown, per_class.size(), split);
  for (const json* c : shown)
    line += fmt::format(" {} {:.3f} ({});", Printable(c->value("class", ""), 24, true), c->value("accuracy", 0.0),
                        c->value("images", int64_t{0}));
  line.pop_back();
  return line;
}

}  // namespace

void ProgressPrinter::Line(const std::string& text) { bar_.Print(text); }

void ProgressPrinter::RoundStart(int round, int64_t max_rounds, size_t fresh, size_t kept, size_t tasks,
                                 size_t done) {
  bar_.Print(fmt::format("\n== round {}/{}: {} new candidates, {} kept ==", round, max_rounds, fresh, kept));
  bar_.Round(round, max_rounds, tasks, done);
}

void ProgressPrinter::TaskStart(const Task& t) {
  if (t.module == "coordinator") {  // launch/coordinator_tasks.h; the why came with its event
    bar_.Print(fmt::format("  {:<8} in the coordinator: {}", workflow::StepName(t.step), coordinator_why_));
    bar_.Start(std::string(workflow::StepName(t.step)) + " in the coordinator");
    return;
  }
  bar_.Print(fmt::format("  {:<8} on {:<3} ({} rank{}) ...", workflow::StepName(t.step), t.module, t.ranks, t.ranks > 1 ? "s" : ""));
  bar_.Start(std::string(workflow::StepName(t.step)) + " on " + t.module);
}

void ProgressPrinter::TaskOutput(const Task&, const std::string& line) { bar_.Print("      " + line); }

void ProgressPrinter::TaskEnd(const Task& t, double seconds) {
  bar_.Print(fmt::format("  {:<8} done in {:.1f} s", workflow::StepName(t.step), seconds));
  bar_.Done();
}

void ProgressPrinter::TaskReused(const Task& t, size_t outputs) {
  bar_.Print(fmt::format("  {:<8} done before the run was resumed ({} output{} committed); not run again", workflow::StepName(t.step),
                         outputs, outputs == 1 ? "" : "s"));
}

void ProgressPrinter::LauncherEvent(const std::string& ev, const json& fields) {
  const record::EventKind kind = record::EventKindOf(ev);
  if (kind == record::EventKind::kSlurmJob) {
    std::string comps;
    for (const auto& c : fields.at("components"))
      comps += (comps.empty() ? "" : ", ") + c.at("id").get<std::string>() + " " + c.at("module").get<std::string>() +
               "@" + c.at("partition").get<std::string>();
    bar_.Print(fmt::format("  slurm {} job {}: {}", fields.at("mode").get<std::string>(),
                           fields.at("job").get<std::string>(), comps));
  } else if (kind == record::EventKind::kSlurmEnd) {
    bar_.Print("  slurm jobs ended " + fields.at("state").get<std::string>());
  } else if (kind == record::EventKind::kSlurmRetry) {
    bar_.Print("  slurm-retry: " + fields.value("message", ""));
  } else if (kind == record::EventKind::kTaskInCoordinator) {
    coordinator_why_ = fields.value("why", "");
  } else if (kind == record::EventKind::kTaskRetry) {
    bar_.Print(fmt::format("  {:<8} failed ({}); starting it again (attempt {} of {})", fields.value("step", ""),
                           fields.value("reason", ""), fields.value("attempt", 0) + 2, fields.value("attempts", 0)));
  }
}

void ProgressPrinter::RoundTable(const Pipeline& p, int round, const RoundOutcome& o) {
  bar_.Clear();
  const json& best = o.best;
  std::fprintf(out_, "\n  %-8s %-12s %-42s %8s %8s   (%s)\n", "cand", "backbone", "head", "acc", "loss",
               p.select_on.c_str());
  for (const auto& e : best.at("all")) {
    Candidate c = CandidateFromJson(e.at("candidate"));
    std::fprintf(out_, "  %-8s %-12s %-42s %8.4f %8.4f%s%s\n", c.id.c_str(), c.backbone.c_str(),
                 HeadLabel(c.head).c_str(), e.at("accuracy").get<double>(), e.at("loss").get<double>(),
                 e.at("round") == round ? "" : "  (kept)", c.finetune ? "  (fine-tuned)" : "");
  }
  const json& champ = best.at("champion");
  std::fprintf(out_, "  best of round %d: %s (%s) accuracy %.4f; features computed %zu, reused %zu%s\n", round,
               champ.at("candidate").at("id").get<std::string>().c_str(),
               champ.at("candidate").at("backbone").get<std::string>().c_str(), champ.at("accuracy").get<double>(),
               o.prepared.at("computed").size(), o.prepared.at("reused").size(),
               !o.prepared.at("computed").empty() ? ""
               : MapsComputed(o.prepared)         ? " (the trunks ran for fine-tuning's maps)"
                                                  : " (no backbone ran this round)");
  if (champ.contains("per_class")) std::fprintf(out_, "%s\n", PerClassLine(champ["per_class"], p.select_on).c_str());
  std::fflush(out_);
}

void ProgressPrinter::Finish(const Pipeline& p, const RoundLoop& loop, double seconds, const std::string& dir) {
  bar_.Clear();
  const Ranked& champ = loop.champion();
  const bool held_out = loop.held_out();
  if (held_out) {
    std::fprintf(out_, "\nchampion: %s — %s on %s, chosen on validation accuracy %.4f; test accuracy %.4f (the result; "
                       "the test split chose nothing) (model %s)\n",
                 champ.candidate.id.c_str(), HeadLabel(champ.candidate.head).c_str(), champ.candidate.backbone.c_str(),
                 champ.metric, champ.test.value("accuracy", 0.0), champ.model.c_str());
  } else {
    std::fprintf(out_, "\nchampion: %s — %s on %s, test accuracy %.4f (model %s)\n"
                       "  note: selected on the test split (select_on \"test\"), so this accuracy is optimistic: the "
                       "same data chose the model\n",
                 champ.candidate.id.c_str(), HeadLabel(champ.candidate.head).c_str(), champ.candidate.backbone.c_str(),
                 champ.metric, champ.model.c_str());
  }
  std::fprintf(out_, "best per backbone (%s accuracy%s):", p.select_on.c_str(), held_out ? "; test accuracy" : "");
  bool untested = false;
  for (const auto& [k, v] : loop.best_per_backbone().items()) {
    std::fprintf(out_, " %s %.4f", k.c_str(), v.at(p.select_on + "_accuracy").get<double>());
    if (held_out && v.contains("test_accuracy")) std::fprintf(out_, " / %.4f", v["test_accuracy"].get<double>());
    if (held_out && !v.contains("test_accuracy")) {  // halving: it left the race before the test split ran
      std::fprintf(out_, " / -");
      untested = true;
    }
    std::fprintf(out_, ";");
  }
  if (untested) std::fprintf(out_, "\n  (-: left the race before the test split ran)");
  std::fprintf(out_, "\nstopped: %s; %.1f s; results in %s/%s\n", loop.stop_reason().c_str(), seconds, dir.c_str(),
               record::kResultsFile);
  std::fflush(out_);
}

}  // namespace msaflow::report
