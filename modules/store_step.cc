// Step 3 (DAM): trained models published in the NAM. Idempotent, so a failed store can simply
// run again: every model is published before any staging object is removed, and a candidate
// whose staging is gone but whose model exists was stored by an earlier attempt.
#include <fmt/core.h>

#include "common/error.h"
#include "kernels/head.h"
#include "modules/model_object.h"
#include "modules/step_context.h"
#include "workflow/objects.h"

namespace msaflow::modules {

void Store(StepContext& c) {
  if (!c.root()) return;  // one writer
  const auto& t = c.task;
  std::vector<std::string> staged_names;
  for (const auto& cand : t.candidates) {
    std::string name = workflow::ModelObject(t.run, t.round, cand.id);
    std::string staging = workflow::StagingObject(t.run, t.round, cand.id);
    if (!c.store->Stat(staging) && c.store->Stat(name)) {
      c.Say(fmt::format("{} was stored by an earlier attempt", name));
      continue;
    }
    nam::Object staged = c.store->Get(staging);  // checksum verified
    // The stored model: head weights + backbone reference + hyper-parameters + curve.
    nlohmann::json meta = staged.info.meta;
    meta["run"] = t.run;
    meta["round"] = t.round;
    HeadFromModel(staged, cand.head);  // shape and layout check
    auto info = c.store->Put(name, staged.bytes, meta);
    staged_names.push_back(staged.info.name);
    c.Say(fmt::format("stored {} ({} bytes, checksum {})", name, info.size, info.checksum));
  }
  for (const auto& n : staged_names) c.store->Remove(n);
}

}  // namespace msaflow::modules
