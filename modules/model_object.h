// A trained head in the NAM (a staged or stored model object, docs/formats.md): its weights as
// bytes, its shape and weights layout in the metadata (internal to modules/).
#pragma once

#include "kernels/head.h"
#include "nam/store.h"

namespace msaflow::modules {

// The head a model object holds, for the configuration it was trained with. Throws kCorrupt
// when its metadata lacks in_dim/classes or its bytes do not fit them, and kInvalidInput when
// an older msaflow wrote it with another weights layout.
kernels::Head HeadFromModel(const nam::Object& m, const kernels::HeadConfig& cfg);

}  // namespace msaflow::modules
