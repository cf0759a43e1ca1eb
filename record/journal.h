// A run's journal, runs/<id>/journal.jsonl (docs/formats.md): one JSON object per line, the
// first naming the format, each later one an event with its time. Appended and fsynced one line
// at a time from the first moment of a run, so a coordinator killed at any point leaves a
// journal that says how far it got; `status`, `resume` and `submit --wait` read it here, and
// only here.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace msaflow::record {

inline constexpr char kJournalFormat[] = "msaflow.journal/1";

// The events a journal holds (docs/formats.md lists each one's fields), named here and only
// here: readers switch on the kind, so a new event is one enumerator the compiler then points
// at every switch that must say what it means. A name this msaflow does not know (a newer
// one's journal) reads as kOther: kept and shown, never acted on.
enum class EventKind {
  kOther,
  kRunStart,
  kRunEnd,
  kRunFailed,
  kResume,
  kNamServer,
  kRoundStart,
  kRoundEnd,
  kRung0,
  kTaskStart,
  kTaskEnd,
  kTaskRetry,
  kTaskReused,
  kTaskInCoordinator,
  kSlurmJob,
  kSlurmState,
  kSlurmEnd,
  kSlurmRetry,
  kSlurmFallback,
  kSlurmReattached,
  kSlurmInterrupted,
  kSlurmCancelled,
};
const char* EventName(EventKind k);              // "run-start"; "" for kOther
EventKind EventKindOf(const std::string& name);  // kOther for a name it does not know

// "2026-11-23T18:51:13.250Z": the journal's time stamps (UTC, to the millisecond).
std::string JournalTime();
// Seconds since the epoch of a journal time stamp (with or without the milliseconds); NaN when
// it is not one.
double ParseJournalTime(const std::string& s);

class JournalWriter {
 public:
  // A new journal: its format line. Throws kInvalidInput when `path` exists.
  static JournalWriter Create(const std::string& path);
  // An existing journal, for a resumed run. A last line torn by a crash mid-write is cut off
  // first, so the next event starts a line of its own and the journal reads whole.
  static JournalWriter Append(const std::string& path);
  // Appends {"event": ..., "time": ..., fields...} and fsyncs. Throws kIo (disk full).
  void Event(EventKind event, nlohmann::json fields) const { Event(std::string(EventName(event)), std::move(fields)); }
  // A launcher's event as it named it (its names are EventKind's; kOther's are written as they are).
  void Event(const std::string& event, nlohmann::json fields) const;
  const std::string& path() const { return path_; }

 private:
  explicit JournalWriter(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

struct JournalEvent {
  size_t line = 0;  // 1-based line in the file
  std::string event;  // its name as written
  nlohmann::json fields;
  EventKind kind = EventKind::kOther;
};

struct Journal {
  std::vector<JournalEvent> events;  // the format line excluded
  bool torn_tail = false;            // the last line was cut short (a crash mid-write) and is left out
};

// Parses a journal's text. `where` names it in errors: "<where>:<line>: not a JSON object".
// Only a last line without its newline may be unreadable (torn_tail); anything else throws
// kCorrupt.
Journal ParseJournal(const std::string& text, const std::string& where);
Journal ReadJournal(const std::string& path);  // + kNotFound

// A journal followed as it grows: each Next() reads only the bytes written since the last call
// and returns the events of the lines completed since, parsed as ParseJournal parses them (a
// line being written is read once it ends). The one way msaflow follows a run as it goes:
// `submit --wait`, the service's event streams, Runs::Observe. Throws kCorrupt for a line that
// is not an event, naming it, and for a journal that shrank.
class JournalFollower {
 public:
  explicit JournalFollower(std::string path) : path_(std::move(path)) {}
  std::vector<JournalEvent> Next();  // none while the file does not exist
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  size_t offset_ = 0, lines_ = 0;  // bytes and whole lines read
  std::string partial_;            // a line not finished yet
  bool format_ = false;            // its format line was read
};

// The coordinator process of a run, as the journal records it (run-start, resume).
struct Coordinator {
  int64_t pid = 0;
  std::string host;
  nlohmann::json ToJson() const { return {{"pid", pid}, {"host", host}}; }
};
Coordinator ThisCoordinator();

// What a journal says about its run.
struct RunSummary {
  std::string run, pipeline, machine, machine_source, launcher, nam;
  Coordinator coordinator;  // the latest one (the run's, or its last resume's)
  int resumes = 0;
  bool finished = false, failed = false;
  bool cancelled = false;  // the last run-failed was a cancel (`msaflow cancel`, a service's DELETE)
  int signal = 0;          // the last run-failed came of this signal to the coordinator
  std::string error;       // of the last run-failed (cleared by a later resume)
  std::string finish;      // "champion X accuracy 0.8850 (max rounds reached)"
  int rounds_ended = 0;    // the highest round with a round-end
  std::string last_started;  // the last task started and not ended
  std::set<std::string> tasks_done;      // ended (task-end) or found done (task-reused)
  std::map<std::string, int> starts;     // task id -> how many times it was started
  std::map<std::string, double> seconds; // task id -> its wall time (task-end)
  std::map<std::string, std::string> started;  // task id -> when it last started (task-start time)
  std::vector<std::string> tasks;        // every task started or reused, in the order first seen
  std::map<std::string, std::string> module;  // task id -> its module (task-start)
  std::map<std::string, int> ranks;      // task id -> its ranks (task-start)
  std::set<std::string> reused;          // task-reused: done by an earlier coordinator
  std::map<std::string, int> retries;    // task id -> task-retry events (a failed attempt run again)
  std::string started_at;                // the run-start time
  std::vector<std::string> slurm_jobs;   // submitted and not seen to end (the last round's)
  std::string nam_slurm_job;             // the Slurm job of the last NAM server started for the run
};
// Throws kCorrupt naming the line of an event that lacks a field it needs.
RunSummary Summarize(const Journal& j, const std::string& where);

}  // namespace msaflow::record
