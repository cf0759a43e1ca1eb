// msaflow's version (meson.build's project version): the CLI's --version, the NAM client's
// hello, scaling reports, and every task's done object (part of what `msaflow why` compares).
#pragma once

namespace msaflow {

inline constexpr char kVersion[] = MSAFLOW_VERSION;

}  // namespace msaflow
