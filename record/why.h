// `msaflow why RUN TASK`: did a task run or was it reused, and when it ran, what differed from
// the last run in the same runs directory that had it. What is compared is the task's content
// key: the msaflow version, the digests of what it read (backbone files, dataset files: the
// done object's `inputs`), and its task file (hyper-parameters, candidates, seeds, kept models;
// the NAM address left out). Only features (prepare) and backbones (load) are reused across runs
// by content; every other task runs once per run, which `why` says when nothing else changed.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace msaflow::record {

// The differences from `before` to `after` as lines "<json pointer>: <old> -> <new>" (values
// cut short), for the leaves that differ; members missing on one side show as "(none)".
std::vector<std::string> JsonChanges(const nlohmann::json& before, const nlohmann::json& after,
                                     const std::string& path = "");

// Prints the explanation. Throws kNotFound (no such run or task), kCorrupt (a damaged journal).
void ExplainTask(const std::string& run_dir, const std::string& task, std::FILE* out);

}  // namespace msaflow::record
