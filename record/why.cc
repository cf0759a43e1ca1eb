#include "record/why.h"

#include <fmt/core.h>

#include <filesystem>
#include <optional>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "record/journal.h"
#include "record/run_dir.h"

namespace msaflow::record {
namespace {

using nlohmann::json;

std::string Short(const json& v) { return v.is_null() ? "(none)" : Printable(v.dump(), 60); }

// What one run's journal and task file say about one task.
struct TaskRecord {
  std::string run_dir, run, started;  // started: the run-start time
  std::string how;                    // "ran" | "reused" | "" (never done)
  double seconds = 0;
  json end;   // the task-end (or task-reused) event
  json body;  // tasks/<task>.json, without the NAM address and run id
};

TaskRecord ReadRecord(const std::string& run_dir, const std::string& task) {
  TaskRecord r;
  r.run_dir = run_dir;
  const std::string path = JournalPath(run_dir);
  const Journal j = ReadJournal(path);
  for (const auto& e : j.events) {
    if (e.kind == EventKind::kRunStart) {
      r.run = e.fields.value("run", "");
      r.started = e.fields.value("time", "");
    }
    if (e.fields.value("task", "") != task) continue;
    if (e.kind == EventKind::kTaskEnd) {
      r.how = "ran";
      r.seconds = e.fields.value("seconds", 0.0);
      r.end = e.fields;
    } else if (e.kind == EventKind::kTaskReused && r.how.empty()) {
      r.how = "reused";
      r.end = e.fields;
    }
  }
  const std::string file = run_dir + "/tasks/" + task + ".json";
  if (PathExists(file)) {
    r.body = json::parse(ReadFile(file), nullptr, false);
    if (r.body.is_discarded()) Throw(ErrorKind::kCorrupt, file + ": not JSON");
    if (r.body.is_object()) {
      r.body.erase("nam");
      r.body.erase("run");
    }
  }
  return r;
}

// The latest other run under the same runs directory, started before `r`, that ran `task`.
std::optional<TaskRecord> Previous(const TaskRecord& r, const std::string& task) {
  std::optional<TaskRecord> best;
  const std::filesystem::path runs = std::filesystem::path(r.run_dir).parent_path();
  std::error_code ec;
  for (std::filesystem::directory_iterator it(runs, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string d = it->path().string();
    if (d == r.run_dir || !HasJournal(d)) continue;
    TaskRecord o;
    try {
      o = ReadRecord(d, task);
    } catch (const Error&) {
      continue;  // a damaged run says nothing about this one
    }
    if (o.how != "ran" || o.started > r.started) continue;
    if (!best || o.started > best->started || (o.started == best->started && o.run_dir > best->run_dir)) best = o;
  }
  return best;
}

}  // namespace

std::vector<std::string> JsonChanges(const json& before, const json& after, const std::string& path) {
  std::vector<std::string> out;
  if (before.is_object() && after.is_object()) {
    for (const auto& [k, v] : before.items()) {
      const json other = after.contains(k) ? after[k] : json();
      auto sub = JsonChanges(v, other, path + "/" + k);
      out.insert(out.end(), sub.begin(), sub.end());
    }
    for (const auto& [k, v] : after.items())
      if (!before.contains(k)) out.push_back(path + "/" + k + ": (none) -> " + Short(v));
    return out;
  }
  if (before.is_array() && after.is_array() && before.size() == after.size()) {
    for (size_t i = 0; i < before.size(); ++i) {
      auto sub = JsonChanges(before[i], after[i], path + "/" + std::to_string(i));
      out.insert(out.end(), sub.begin(), sub.end());
    }
    return out;
  }
  if (before != after) out.push_back((path.empty() ? "/" : path) + ": " + Short(before) + " -> " + Short(after));
  return out;
}

void ExplainTask(const std::string& run_dir_arg, const std::string& task, std::FILE* out) {
  const std::string run_dir = std::filesystem::absolute(run_dir_arg).lexically_normal().string();
  const TaskRecord r = ReadRecord(run_dir, task);
  if (r.body.is_null() && r.how.empty())
    Throw(ErrorKind::kNotFound, run_dir + ": no task " + task + " (task ids are r<round>-<step>, e.g. r1-prepare)");
  const std::string key = r.end.value("key", "");
  if (r.how.empty()) {
    std::fprintf(out, "%s in run %s: planned, not done (the run stopped or failed before it ended)\n", task.c_str(),
                 r.run.c_str());
    return;
  }
  if (r.how == "reused") {
    std::fprintf(out, "%s in run %s: reused — an earlier coordinator of this run finished it (key %s), so the "
                      "resumed run did not run it again\n",
                 task.c_str(), r.run.c_str(), key.c_str());
    return;
  }
  std::fprintf(out, "%s in run %s: ran (%.1f s, key %s)\n", task.c_str(), r.run.c_str(), r.seconds, key.c_str());
  // Inside the task: what prepare and load reused by content.
  std::vector<std::string> changes;
  const auto prev = Previous(r, task);
  if (!prev) {
    std::fprintf(out, "  no earlier run in %s ran %s: nothing to compare with\n",
                 std::filesystem::path(run_dir).parent_path().c_str(), task.c_str());
    return;
  }
  std::fprintf(out, "  compared with run %s (%s), where it ran with key %s:\n", prev->run.c_str(), prev->started.c_str(),
               prev->end.value("key", "").c_str());
  const json before = {{"msaflow", prev->end.value("msaflow", json())},
                       {"inputs", prev->end.value("inputs", json::object())}, {"task", prev->body}};
  const json after = {{"msaflow", r.end.value("msaflow", json())},
                      {"inputs", r.end.value("inputs", json::object())}, {"task", r.body}};
  changes = JsonChanges(before, after);
  if (changes.empty()) {
    std::fprintf(out, "  nothing in its key changed: it ran because a run's %s task always runs in that run; only "
                      "features (prepare) and backbones (load) are reused across runs by their content\n",
                 task.substr(task.find('-') + 1).c_str());
    return;
  }
  for (const auto& c : changes) {
    // "<pointer>: <old> -> <new>", the pointer said in words.
    const size_t colon = c.find(": ");
    const std::string ptr = c.substr(0, colon), values = c.substr(colon);
    std::string label = ptr;
    if (ptr.rfind("/inputs/datasets/", 0) == 0) label = "dataset " + ptr.substr(17) + " (its files' content)";
    if (ptr.rfind("/inputs/backbones/", 0) == 0) label = "backbone " + ptr.substr(18) + " (model file, cut or input)";
    if (ptr.rfind("/task/", 0) == 0) label = "task file " + ptr.substr(5);
    if (ptr == "/msaflow") label = "msaflow version";
    std::fprintf(out, "  changed: %s%s\n", label.c_str(), values.c_str());
  }
}

}  // namespace msaflow::record
