// The executor's arithmetic as a type (kernels/executor.h says what each does): what a
// pipeline's backbone "precision" is parsed into, without the executor's header.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace msaflow::kernels {

enum class Precision { kF32, kBF16, kInt8 };

// "f32" | "bf16" | "int8" (pipeline and CLI spelling); throws kInvalidInput naming the choices.
Precision ParsePrecision(const std::string& name);
std::optional<Precision> PrecisionFromName(std::string_view name);
const char* PrecisionName(Precision p);
// Whether this CPU runs `p` on oneDNN's fast kernels; `why` says what is missing when not.
bool PrecisionAvailable(Precision p, std::string* why);

}  // namespace msaflow::kernels
