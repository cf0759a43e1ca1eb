// `msaflow report RUN`: one self-contained report.html (no script, no network; inline SVG and
// CSS) from the run's provenance.json and results (record/run_dir.h): every candidate's accuracy per round with
// the best so far, a Gantt chart of the tasks per module, the training curves, the champion's
// confusion matrix, and the tasks and candidates as tables.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace msaflow::report {

struct ReportInput {
  nlohmann::json provenance;  // provenance.json (msaflow.provenance/1)
  nlohmann::json results;     // the run's results, or null while the run has not finished
  std::string state;          // the run's state now, as `status` says it ("finished: ...")
};

// The report's HTML. Throws kCorrupt naming the field when the provenance is not one.
std::string RenderReport(const ReportInput& in);

// Reads RUN_DIR's files, writes the report atomically to `out` ("" = RUN_DIR/report.html) and
// returns its path. Throws kNotFound when the run has no provenance.json (no round ended yet).
std::string WriteReport(const std::string& run_dir, const std::string& out);

}  // namespace msaflow::report
