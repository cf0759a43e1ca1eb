#include "record/journal.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <stdexcept>

#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"

namespace msaflow::record {
namespace {

using nlohmann::json;

}  // namespace

std::string JournalTime() {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  std::tm utc{};
  ::gmtime_r(&now.tv_sec, &utc);
  char ts[40];
  const size_t n = std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(ts + n, sizeof ts - n, ".%03ldZ", now.tv_nsec / 1000000);
  return ts;
}

double ParseJournalTime(const std::string& s) {
  std::tm utc{};
  const char* rest = ::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &utc);
  if (!rest) return std::nan("");
  double frac = 0;
  if (*rest == '.') {
    char* end = nullptr;
    frac = std::strtod(rest, &end);
    rest = end;
  }
  if (std::string(rest) != "Z") return std::nan("");
  return static_cast<double>(::timegm(&utc)) + frac;
}

JournalWriter JournalWriter::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) Throw(ErrorKind::kInvalidInput, path + " already exists");
    ThrowErrno("create " + path);
  }
  ::close(fd);
  AppendLineSynced(path, json{{"format", kJournalFormat}, {"time", JournalTime()}}.dump());
  return JournalWriter(path);
}

JournalWriter JournalWriter::Append(const std::string& path) {
  const std::string text = ReadFile(path);
  ParseJournal(text, path);  // refuses to append to something that is not a journal
  if (!text.empty() && text.back() != '\n') {
    // A line torn by a crash mid-write: its bytes go, so the next event starts a line and the
    // journal reads whole again.
    const size_t keep = text.rfind('\n') + 1;  // 0 when there is no newline at all
    if (::truncate(path.c_str(), static_cast<off_t>(keep)) != 0) ThrowErrno("truncate " + path);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) ThrowErrno("open " + path);
    const int rc = ::fsync(fd);
    ::close(fd);
    if (rc != 0) ThrowErrno("fsync " + path);
  }
  return JournalWriter(path);
}

void JournalWriter::Event(const std::string& event, json fields) const {
  fields["event"] = event;
  fields["time"] = JournalTime();
  AppendLineSynced(path_, fields.dump());
}

namespace {

// Where the first non-integer number of magnitude 2^31 or more is in `v` ("/a/0"), or "" when
// there is none; *value is that number. The journal's readers take its numbers as int where
// they count (rounds, ranks, attempts), and converting such a float to int is undefined;
// msaflow never writes one.
std::string HugeFloatAt(const json& v, const std::string& at, std::string* value) {
  if (v.is_number_float()) {
    if (std::fabs(v.get<double>()) < 2147483648.0) return "";
    *value = v.dump();
    return at.empty() ? "/" : at;
  }
  if (v.is_object()) {
    for (const auto& [k, x] : v.items())
      if (std::string found = HugeFloatAt(x, at + "/" + k, value); !found.empty()) return found;
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i)
      if (std::string found = HugeFloatAt(v[i], at + "/" + std::to_string(i), value); !found.empty()) return found;
  }
  return "";
}

}  // namespace

namespace {
struct EventNames {
  EventKind kind;
  const char* name;
};
constexpr EventNames kEventNames[] = {
    {EventKind::kRunStart, "run-start"},
    {EventKind::kRunEnd, "run-end"},
    {EventKind::kRunFailed, "run-failed"},
    {EventKind::kResume, "resume"},
    {EventKind::kNamServer, "nam-server"},
    {EventKind::kRoundStart, "round-start"},
    {EventKind::kRoundEnd, "round-end"},
    {EventKind::kRung0, "rung0"},
    {EventKind::kTaskStart, "task-start"},
    {EventKind::kTaskEnd, "task-end"},
    {EventKind::kTaskRetry, "task-retry"},
    {EventKind::kTaskReused, "task-reused"},
    {EventKind::kTaskInCoordinator, "task-in-coordinator"},
    {EventKind::kSlurmJob, "slurm-job"},
    {EventKind::kSlurmState, "slurm-state"},
    {EventKind::kSlurmEnd, "slurm-end"},
    {EventKind::kSlurmRetry, "slurm-retry"},
    {EventKind::kSlurmFallback, "slurm-fallback"},
    {EventKind::kSlurmReattached, "slurm-reattached"},
    {EventKind::kSlurmInterrupted, "slurm-interrupted"},
    {EventKind::kSlurmCancelled, "slurm-cancelled"},
};
}  // namespace

const char* EventName(EventKind k) {
  for (const auto& e : kEventNames)
    if (e.kind == k) return e.name;
  return "";
}

EventKind EventKindOf(const std::string& name) {
  for (const auto& e : kEventNames)
    if (name == e.name) return e.kind;
  return EventKind::kOther;
}

namespace {

// One line of a journal, not its format line: the event. Throws kCorrupt naming `at`.
JournalEvent ParseEventLine(json e, size_t lineno, const std::string& at) {
  if (!e.contains("event") || !e["event"].is_string())
    Throw(ErrorKind::kCorrupt, at + "an event without its \"event\" name");
  std::string value;
  if (const std::string huge = HugeFloatAt(e, "", &value); !huge.empty())
    Throw(ErrorKind::kCorrupt, at + "a number out of range at " + Printable(huge, 60) + " (" + Printable(value, 40) +
                                   "): a journal's numbers are integers or below 2^31");
  std::string name = e["event"].get<std::string>();
  const EventKind kind = EventKindOf(name);
  return {lineno, std::move(name), std::move(e), kind};
}

// A journal's line `lineno`, whole and not empty: nullopt for its format line (the first such
// line, checked; `*format` says whether it was seen), else its event.
std::optional<JournalEvent> ParseLine(const std::string& line, size_t lineno, const std::string& where, bool* format) {
  const json e = json::parse(line, nullptr, false);
  const std::string at = where + ":" + std::to_string(lineno) + ": ";
  if (e.is_discarded()) Throw(ErrorKind::kCorrupt, at + "not a JSON line");
  if (!e.is_object()) Throw(ErrorKind::kCorrupt, at + "not a JSON object");
  if (!*format) {
    if (!e.contains("format") || e["format"] != kJournalFormat)
      Throw(ErrorKind::kCorrupt, at + "expected format " + std::string(kJournalFormat));
    *format = true;
    return std::nullopt;
  }
  return ParseEventLine(e, lineno, at);
}

}  // namespace

Journal ParseJournal(const std::string& text, const std::string& where) {
  Journal j;
  size_t start = 0, lineno = 0;
  bool format = false;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    const bool last_unended = end == std::string::npos;
    if (last_unended) end = text.size();
    ++lineno;
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    // A crash mid-write: the last line never ended.
    if (last_unended && format && json::parse(line, nullptr, false).is_discarded()) {
      j.torn_tail = true;
      break;
    }
    if (auto e = ParseLine(line, lineno, where, &format)) j.events.push_back(std::move(*e));
  }
  if (!format) Throw(ErrorKind::kCorrupt, where + ":1: expected format " + std::string(kJournalFormat));
  return j;
}

std::vector<JournalEvent> JournalFollower::Next() {
  std::vector<JournalEvent> out;
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0 || static_cast<size_t>(st.st_size) == offset_) return out;
  std::ifstream f(path_, std::ios::binary);
  if (!f) return out;
  f.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(f.tellg());
  if (size < offset_)  // replaced, which journals never are
    Throw(ErrorKind::kCorrupt, path_ + ": shrank from " + std::to_string(offset_) + " to " + std::to_string(size) +
                                   " bytes while it was followed; a journal is only appended to");
  std::string chunk(size - offset_, '\0');
  f.seekg(static_cast<std::streamoff>(offset_));
  f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
  chunk.resize(static_cast<size_t>(f.gcount()));
  offset_ += chunk.size();
  partial_ += chunk;
  // Line by line; a bad line stays unread, so that the events before it are given first and
  // every later call names it.
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (nl > start) {
      std::optional<JournalEvent> e;
      try {
        e = ParseLine(partial_.substr(start, nl - start), lines_ + 1, path_, &format_);
      } catch (const Error&) {
        partial_.erase(0, start);
        if (out.empty()) throw;
        return out;
      }
      if (e) out.push_back(std::move(*e));
    }
    ++lines_;
  }
  partial_.erase(0, start);
  return out;
}

Journal ReadJournal(const std::string& path) { return ParseJournal(ReadFile(path), path); }

Coordinator ThisCoordinator() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return {static_cast<int64_t>(::getpid()), host};
}

namespace {

// An integer field in [lo, hi]. Not get<int>(): on a float such as 1e128 that is undefined
// behaviour (a float-to-int cast out of range), and on 2^40 it wraps.
int64_t IntField(const json& f, const char* key, int64_t lo, int64_t hi) {
  const json& v = f.at(key);
  const bool fits = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX});
  if (!fits || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
    throw std::invalid_argument(fmt::format("\"{}\": expected an integer from {} to {}, got {}", key, lo, hi,
                                            Printable(v.dump(), 40)));
  return v.get<int64_t>();
}

}  // namespace

RunSummary Summarize(const Journal& j, const std::string& where) {
  RunSummary s;
  for (const auto& e : j.events) try {
    const json& f = e.fields;
    auto coordinator = [&] {
      if (f.contains("coordinator")) {
        s.coordinator.pid = IntField(f["coordinator"], "pid", 0, INT64_MAX);
        s.coordinator.host = f["coordinator"].at("host").get<std::string>();
      }
    };
    switch (e.kind) {
      case EventKind::kRunStart:
        s.run = f.value("run", "");
        s.pipeline = f.value("pipeline", "");
        s.machine = f.value("machine", "");
        s.machine_source = f.value("machine_source", "");
        s.launcher = f.value("launcher", "local");
        s.nam = f.value("nam", "");
        s.started_at = f.value("time", "");
        coordinator();
        break;
      case EventKind::kResume:
        ++s.resumes;
        s.failed = false;
        s.cancelled = false;
        s.signal = 0;
        s.error.clear();
        s.last_started.clear();
        coordinator();
        break;
      case EventKind::kTaskStart: {
        const std::string t = f.at("task").get<std::string>();
        if (!s.starts.count(t) && !s.reused.count(t)) s.tasks.push_back(t);
        ++s.starts[t];
        s.last_started = t;
        s.started[t] = f.value("time", "");
        s.module[t] = f.value("module", "");
        s.ranks[t] = f.contains("ranks") ? static_cast<int>(IntField(f, "ranks", 1, 1 << 24)) : 1;
        break;
      }
      case EventKind::kTaskRetry:
        ++s.retries[f.at("task").get<std::string>()];
        break;
      case EventKind::kTaskEnd:
      case EventKind::kTaskReused: {
        const std::string t = f.at("task").get<std::string>();
        s.tasks_done.insert(t);
        if (e.kind == EventKind::kTaskEnd) s.seconds[t] = f.value("seconds", 0.0);
        if (e.kind == EventKind::kTaskReused) {
          if (!s.starts.count(t) && !s.reused.count(t)) s.tasks.push_back(t);
          s.reused.insert(t);
        }
        if (s.last_started == t) s.last_started.clear();
        break;
      }
      case EventKind::kNamServer:
        s.nam_slurm_job = f.value("slurm_job", "");
        break;
      case EventKind::kSlurmJob:
        s.slurm_jobs.push_back(f.at("job").get<std::string>());
        break;
      case EventKind::kSlurmEnd:
      case EventKind::kSlurmInterrupted:
      case EventKind::kSlurmCancelled:
      case EventKind::kSlurmReattached:
        s.slurm_jobs.clear();
        break;
      case EventKind::kRoundEnd:
        s.rounds_ended = std::max(s.rounds_ended, static_cast<int>(IntField(f, "round", 0, INT32_MAX)));
        break;
      case EventKind::kRunFailed:
        s.failed = true;
        s.cancelled = f.value("cancelled", false);
        s.signal = f.contains("signal") ? static_cast<int>(IntField(f, "signal", 0, 128)) : 0;
        s.error = f.value("error", "");
        break;
      case EventKind::kRunEnd:
        s.finished = true;
        s.finish = fmt::format("champion {} accuracy {:.4f} ({})", f.value("champion", ""), f.value("accuracy", 0.0),
                               f.value("stop", ""));
        break;
      case EventKind::kOther:
      case EventKind::kRoundStart:
      case EventKind::kRung0:
      case EventKind::kTaskInCoordinator:
      case EventKind::kSlurmState:
      case EventKind::kSlurmRetry:
      case EventKind::kSlurmFallback:
        break;  // nothing the summary keeps
    }
  } catch (const std::exception& x) {  // json::exception, or IntField's
    // A field missing or of the wrong type: the journal was edited or damaged.
    Throw(ErrorKind::kCorrupt, where + ":" + std::to_string(e.line) + ": a malformed '" + Printable(e.event, 40) +
                                   "' event (" + x.what() + ")");
  }
  return s;
}

}  // namespace msaflow::record
