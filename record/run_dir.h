// A run's directory (runs/<id>/, docs/formats.md) and the files that are its record, owned here:
// no other folder spells their names (scripts/check_layers.py checks it); it asks for a path or
// for the file read. What each holds:
//   the journal    every event of the run, appended and fsynced (record/journal.h)
//   the results    rounds, champion, test result, costs: written when the run finishes
//   the submitted  the Slurm job its coordinator was submitted as (`msaflow submit`)
//   the pipeline   the pipeline as the run read it (absolute paths), what `resume` reads back
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "common/files.h"
#include "launch/submitted.h"

namespace msaflow::record {

inline constexpr char kJournalFile[] = "journal.jsonl";
inline constexpr char kResultsFile[] = "results.json";
inline constexpr char kSubmittedFile[] = "submitted.json";
inline constexpr char kPipelineFile[] = "pipeline.json";

inline std::string JournalPath(const std::string& run_dir) { return run_dir + "/" + kJournalFile; }
inline std::string ResultsPath(const std::string& run_dir) { return run_dir + "/" + kResultsFile; }
inline std::string SubmittedPath(const std::string& run_dir) { return run_dir + "/" + kSubmittedFile; }
inline std::string PipelinePath(const std::string& run_dir) { return run_dir + "/" + kPipelineFile; }

// The runs directory's NAM objects: where a local run's NAM server persists them (the runs
// directory's shared server, launch/shared_nam.h), so a finished run's models are read from
// here once its server is gone. `runs_dir` is the run directory's parent.
inline std::string PersistedNamPath(const std::string& runs_dir) { return runs_dir + "/nam"; }

// The run began: its coordinator wrote the journal's first line.
inline bool HasJournal(const std::string& run_dir) { return PathExists(JournalPath(run_dir)); }
// The run finished and wrote its results.
inline bool HasResults(const std::string& run_dir) { return PathExists(ResultsPath(run_dir)); }
// Its coordinator was submitted to a batch system.
inline bool WasSubmitted(const std::string& run_dir) { return PathExists(SubmittedPath(run_dir)); }

namespace detail {
inline nlohmann::json ReadObject(const std::string& path) {
  nlohmann::json j = nlohmann::json::parse(ReadFile(path), nullptr, false);
  if (j.is_discarded() || !j.is_object()) Throw(ErrorKind::kCorrupt, path + ": not a JSON object");
  return j;
}
}  // namespace detail

// The files read whole. Throw kNotFound when absent, kCorrupt when not a JSON object.
inline nlohmann::json ReadResults(const std::string& run_dir) { return detail::ReadObject(ResultsPath(run_dir)); }
inline nlohmann::json ReadSubmitted(const std::string& run_dir) { return detail::ReadObject(SubmittedPath(run_dir)); }
inline nlohmann::json ReadRunPipeline(const std::string& run_dir) { return detail::ReadObject(PipelinePath(run_dir)); }

// The submitted record, typed: the coordinator job to ask or cancel (launch/submitted.h).
inline launch::SubmittedCoordinator ReadSubmittedCoordinator(const std::string& run_dir) {
  return launch::SubmittedCoordinator::FromRecord(ReadSubmitted(run_dir), SubmittedPath(run_dir));
}
inline void WriteSubmitted(const std::string& run_dir, const launch::SubmittedCoordinator& c) {
  WriteFileAtomic(SubmittedPath(run_dir), c.ToRecord().dump() + "\n");
}

}  // namespace msaflow::record
