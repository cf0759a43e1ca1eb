// `msaflow nam verify [--repair]`: read every object of a NAM (a server or a directory), check
// every checksum, list the damaged ones, and with repair move them aside (file://: into
// DIR/DAMAGED/; a server moves the persisted file aside when asked to remove a damaged object).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nam/store.h"

namespace msaflow::nam {

struct Damaged {
  std::string name;
  std::string why;
  std::string moved_to;  // with repair: where its file went ("" if it stayed)
};

struct VerifyReport {
  int64_t objects = 0;  // checked, damaged included
  uint64_t bytes = 0;   // of the good ones
  std::vector<Damaged> damaged;
};

VerifyReport Verify(Store& store, bool repair);

}  // namespace msaflow::nam
